package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// The decoder walks the generic document BurntSushi/toml produced and fills
// a Config, reporting every unknown key and type mismatch with its position.
//
// It does not use toml.MetaData.Undecoded for unknown keys: the decoder
// matches struct fields case-insensitively (so "Kind" or a second "KIND"
// would silently count as decoded) and Undecoded names keys without the
// index of their [[vm]] entry. Walking the document against an explicit
// schema is exact and gives each key's entry.

// source remembers where a parsed Config's keys were written.
type source struct {
	file string
	pos  map[string]position
}

// newError builds an Error about key, placed at its value (or at the key
// itself when atKey) if the key was written in the file. s may be nil.
func (s *source) newError(key string, atKey bool, cause error, format string, args ...any) *Error {
	e := &Error{Key: key, Msg: fmt.Sprintf(format, args...), Err: cause}
	if s == nil {
		return e
	}
	e.File = s.file
	if p, ok := s.pos[key]; ok {
		e.Line, e.Col = p.line, p.col
		if !atKey && p.valCol > 0 {
			e.Col = p.valCol
		}
	}
	return e
}

// written reports whether key was written in the file. s may be nil.
func (s *source) written(key string) bool {
	if s == nil {
		return false
	}
	_, ok := s.pos[key]
	return ok
}

// field is one known key of a table and how to store its value.
type field struct {
	name string
	set  func(v any) error
}

type decoder struct {
	c      *Config
	errs   ErrorList
	failed map[string]bool // keys whose value could not be decoded
}

func (d *decoder) fail(key string, atKey bool, cause error) {
	d.failed[key] = true
	d.errs = append(d.errs, d.c.src.newError(key, atKey, cause, "%s", cause))
}

func (d *decoder) document(doc map[string]any) {
	c := d.c
	tables := []field{
		{"board", d.table("board", []field{
			{"kind", setString(&c.Board.Kind)},
			{"pci_address", setString(&c.Board.PCIAddress)},
			{"vram", setSize(&c.Board.VRAM)},
			{"channels", setInt(&c.Board.Channels)},
			{"mem_partitions", setInt(&c.Board.MemPartitions)},
			{"timing", setString(&c.Board.Timing)},
			{"overcommit", setFloat(&c.Board.Overcommit)},
		})},
		{"daemon", d.table("daemon", []field{
			{"socket", setString(&c.Daemon.Socket)},
			{"control_socket", setString(&c.Daemon.ControlSocket)},
			{"max_vms", setInt(&c.Daemon.MaxVMs)},
			{"log_level", setString(&c.Daemon.LogLevel)},
			{"placement", setString(&c.Daemon.Placement)},
			{"balance", setString(&c.Daemon.Balance)},
			{"balance_interval", setDuration(&c.Daemon.BalanceInterval)},
			{"balance_threshold", setFloat(&c.Daemon.BalanceThreshold)},
			{"balance_hold", setDuration(&c.Daemon.BalanceHold)},
			{"evict_idle", setDuration(&c.Daemon.EvictIdle)},
			{"restore_wait", setDuration(&c.Daemon.RestoreWait)},
			{"min_residency", setDuration(&c.Daemon.MinResidency)},
		})},
		{"partition", d.table("partition", []field{
			{"vram_per_vm", setSize(&c.Partition.VRAMPerVM)},
			{"channels_per_vm", setInt(&c.Partition.ChannelsPerVM)},
			{"bar1_per_vm", setSize(&c.Partition.BAR1PerVM)},
			{"bar3_per_vm", setSize(&c.Partition.BAR3PerVM)},
			{"reserved", setSize(&c.Partition.Reserved)},
		})},
		{"scheduler", d.table("scheduler", []field{
			{"policy", setString(&c.Scheduler.Policy)},
			{"period", setDuration(&c.Scheduler.Period)},
			{"band_wait", setDuration(&c.Scheduler.BandWait)},
			{"band_poll", setDuration(&c.Scheduler.BandPoll)},
			{"timeslice", setDuration(&c.Scheduler.Timeslice)},
			{"poll", setDuration(&c.Scheduler.Poll)},
			{"sample_time", setDuration(&c.Scheduler.SampleTime)},
			{"sample_requests", setInt(&c.Scheduler.SampleRequests)},
			{"free_run_factor", setInt(&c.Scheduler.FreeRunFactor)},
			{"watchdog", setDuration(&c.Scheduler.Watchdog)},
			{"doorbell", setString(&c.Scheduler.Doorbell)},
			{"doorbell_poll", setDuration(&c.Scheduler.DoorbellPoll)},
			{"sla_feedback", setBool(&c.Scheduler.SLAFeedback)},
			{"sla_window", setDuration(&c.Scheduler.SLAWindow)},
			{"sla_boost", setInt(&c.Scheduler.SLABoost)},
			{"sla_max_boost", setInt(&c.Scheduler.SLAMaxBoost)},
		})},
		{"metrics", d.table("metrics", []field{
			{"listen", setString(&c.Metrics.Listen)},
		})},
		{"boards", d.boards},
		{"vm", d.vms},
		{"profile", d.profiles},
	}
	d.fields("", doc, tables)
}

// fields decodes the keys of table prefix (m) with fs, in file order,
// reporting unknown keys.
func (d *decoder) fields(prefix string, m map[string]any, fs []field) {
	for _, k := range d.ordered(prefix, m) {
		key := joinKey(prefix, k)
		i := slices.IndexFunc(fs, func(f field) bool { return f.name == k })
		if i < 0 {
			d.unknown(key, k, m[k], fs)
			continue
		}
		if err := fs[i].set(m[k]); err != nil {
			d.fail(key, false, err)
		}
	}
}

// ordered returns m's keys sorted by where they were written.
func (d *decoder) ordered(prefix string, m map[string]any) []string {
	keys := slices.Sorted(maps.Keys(m))
	pos := d.c.src.pos
	slices.SortStableFunc(keys, func(a, b string) int {
		pa, pb := pos[joinKey(prefix, a)], pos[joinKey(prefix, b)]
		if pa.line != pb.line {
			return pa.line - pb.line
		}
		return pa.col - pb.col
	})
	return keys
}

func (d *decoder) unknown(key, name string, v any, fs []field) {
	what := "unknown key"
	if _, isTable := v.(map[string]any); isTable && d.c.src.pos[key].header {
		what = "unknown table"
	}
	if s := suggest(name, fs); s != "" {
		what += fmt.Sprintf(" (did you mean %q?)", s)
	}
	d.failed[key] = true
	d.errs = append(d.errs, d.c.src.newError(key, true, nil, "%s", what))
}

// suggest returns the known name closest to name, if it is close.
func suggest(name string, fs []field) string {
	best, bestDist := "", 3
	for _, f := range fs {
		if strings.EqualFold(f.name, name) {
			return f.name
		}
		if dist := editDistance(strings.ToLower(name), f.name); dist < bestDist {
			best, bestDist = f.name, dist
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// table returns a setter that decodes a sub-table with fs.
func (d *decoder) table(name string, fs []field) func(v any) error {
	return func(v any) error {
		m, ok := v.(map[string]any)
		if !ok {
			return typeError("a table", v)
		}
		d.fields(name, m, fs)
		return nil
	}
}

// arrayOfTables returns the entries of an array of tables ([[name]]).
func arrayOfTables(name string, v any) ([]any, error) {
	var entries []any
	switch a := v.(type) {
	case []map[string]any:
		for _, m := range a {
			entries = append(entries, m)
		}
	case []any:
		entries = a
	default:
		return nil, typeError("an array of tables ([["+name+"]])", v)
	}
	return entries, nil
}

// vms decodes the [[vm]] array.
func (d *decoder) vms(v any) error {
	entries, err := arrayOfTables("vm", v)
	if err != nil {
		return err
	}
	for i, e := range entries {
		key := indexKey("vm", i)
		vm := DefaultVM()
		if m, ok := e.(map[string]any); ok {
			d.fields(key, m, []field{
				{"name", setString(&vm.Name)},
				{"domid", setInt(&vm.DomID)},
				{"mode", setString(&vm.Mode)},
				{"weight", setInt(&vm.Weight)},
				{"vram", setSize(&vm.VRAM)},
				{"channels", setInt(&vm.Channels)},
				{"bar1", setSize(&vm.BAR1)},
				{"bar3", setSize(&vm.BAR3)},
				{"profile", setString(&vm.Profile)},
				{"board", setString(&vm.Board)},
				{"slo", setDuration(&vm.SLO)},
			})
		} else {
			d.fail(key, false, typeError("a table", e))
		}
		d.c.VMs = append(d.c.VMs, vm)
	}
	return nil
}

func setString[T ~string](p *T) func(any) error {
	return func(v any) error {
		s, ok := v.(string)
		if !ok {
			return typeError("a string", v)
		}
		*p = T(s)
		return nil
	}
}

func setInt(p *int) func(any) error {
	return func(v any) error {
		n, ok := v.(int64)
		if !ok {
			return typeError("an integer", v)
		}
		if n < math.MinInt || n > math.MaxInt {
			return fmt.Errorf("integer %d out of range", n)
		}
		*p = int(n)
		return nil
	}
}

func setSize(p *Size) func(any) error {
	return func(v any) error {
		switch x := v.(type) {
		case int64:
			if x < 0 {
				return fmt.Errorf("invalid size %d: negative", x)
			}
			*p = Size(x)
		case string:
			s, err := ParseSize(x)
			if err != nil {
				return err
			}
			*p = s
		default:
			return typeError(`a size (integer bytes or a string like "512MiB")`, v)
		}
		return nil
	}
}

func setDuration(p *Duration) func(any) error {
	return func(v any) error {
		switch x := v.(type) {
		case int64:
			if x != 0 {
				return fmt.Errorf("integer %d has no unit: write a duration string like \"100ms\"", x)
			}
			*p = Duration{}
		case string:
			d, err := ParseDuration(x)
			if err != nil {
				return err
			}
			*p = d
		default:
			return typeError(`a duration string like "100ms"`, v)
		}
		return nil
	}
}

// typeError describes a value of the wrong TOML type.
func typeError(want string, v any) error {
	var got string
	switch x := v.(type) {
	case string:
		got = fmt.Sprintf("string %q", x)
	case int64:
		got = fmt.Sprintf("integer %d", x)
	case float64:
		got = fmt.Sprintf("float %v", x)
	case bool:
		got = fmt.Sprintf("boolean %v", x)
	case map[string]any:
		got = "a table"
	case []any, []map[string]any:
		got = "an array"
	case time.Time, fmt.Stringer:
		got = "a date-time"
	default:
		got = fmt.Sprintf("%T", v)
	}
	return errors.New("expected " + want + ", got " + got)
}
