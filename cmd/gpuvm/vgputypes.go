package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/config"
)

// vgpuTypesCommand is `gpuvm vgpu types`: the daemon's vGPU profiles and
// how many more of each fit now (as mdevctl types and nvidia-smi vgpu -s).
func vgpuTypesCommand(ctl cli.Flag) *cli.Command {
	return &cli.Command{
		Name:  "types",
		Usage: "the vGPU profiles (named sizes) and how many more vGPUs of each fit now",
		Description: "A profile is a named vGPU size: VRAM, channels, BAR1 and BAR3 slices and a default\n" +
			"scheduler weight. Three are built in, derived from the [partition] table (the whole\n" +
			"slot, half and a quarter of one); the config adds its own with [[profile]] tables.\n" +
			"A VM names one with profile = \"...\" in its [[vm]] entry, profile=... in its xl\n" +
			"config's gpuvm key, or in its libvirt metadata. AVAILABLE counts the free slots the\n" +
			"profile fits: slots are fixed by [partition], so a smaller profile narrows a slot but\n" +
			"does not make room for more VMs.",
		Flags: []cli.Flag{ctl, &cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"}},
		Action: func(c *cli.Context) error {
			var types []aggregator.TypeInfo
			if err := controlGet(c.Context, c.Path("control-socket"), "/v1/types", &types); err != nil {
				return err
			}
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(types)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVRAM\tCHANNELS\tBAR1\tBAR3\tWEIGHT\tAVAILABLE\tDESCRIPTION")
			for _, t := range types {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\n", t.Name, config.Size(t.VRAM), t.Channels,
					config.Size(t.BAR1), config.Size(t.BAR3), t.Weight, t.Available, t.Description)
			}
			return tw.Flush()
		},
	}
}
