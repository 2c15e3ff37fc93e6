package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/gpuvm/gpuvm/aggregator"
	"github.com/gpuvm/gpuvm/gpu/sim"
	"github.com/gpuvm/gpuvm/ipc"
)

// served is a simulated board and an aggregator serving device models on a
// private socket, for one benchmark run.
type served struct {
	board *sim.Board
	agg   *aggregator.Aggregator
	ln    *ipc.Listener
	dir   string
	stop  context.CancelFunc
	done  chan error
}

// serveBoard builds a board from bc — each VM slot's VRAM its own segment, so
// BAR remap can hand it out — and an aggregator with opts (its Channels and
// bus costs taken from the board), serving on a socket in a temporary
// directory until close.
func serveBoard(ctx context.Context, bc sim.Config, opts aggregator.Options, listen *ipc.ListenOptions) (s *served, err error) {
	layout, err := aggregator.NewLayout(opts.Partition, opts.MaxVMs, bc.VRAMSize, bc.Channels)
	if err != nil {
		return nil, err
	}
	bc.VRAMSegments = layout.Segments(bc.VRAMSize)
	s = &served{done: make(chan error, 1)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.board, err = sim.New(bc); err != nil {
		return s, err
	}
	opts.Channels, opts.BusReadNs, opts.BusWriteNs, opts.TrapNs, opts.Timing = bc.Channels, bc.Timing.MMIOReadNs, bc.Timing.MMIOWriteNs, bc.Timing.TrapNs, bc.Timing.Name
	if s.agg, err = aggregator.New(s.board, opts); err != nil {
		return s, err
	}
	if s.dir, err = os.MkdirTemp("", "gpuvm-bench-"); err != nil {
		return s, err
	}
	if s.ln, err = ipc.Listen(filepath.Join(s.dir, "aggregator.sock"), listen); err != nil {
		return s, err
	}
	sctx, stop := context.WithCancel(ctx)
	s.stop = stop
	go func() { s.done <- s.agg.Serve(sctx, s.ln) }()
	return s, nil
}

// socket is where device models connect.
func (s *served) socket() string { return s.ln.Addr() }

// close stops serving and releases everything.
func (s *served) close() error {
	var errs []error
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	if s.ln != nil {
		errs = append(errs, s.ln.Close())
	}
	if s.agg != nil {
		errs = append(errs, s.agg.Close())
	}
	if s.board != nil {
		errs = append(errs, s.board.Close())
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}
