package xenbus

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// A back end handed to a new back-end process (gpuvm serve's handoff,
// docs/protocol.md §15.5) stays Connected, and its front end sees nothing
// while the new process takes it over. Should no process take it over
// (the new one crashed, or could not start), nothing would tell the front
// end: the old process disarmed what tells it of a crash. So the old
// process marks the back end's directory with KeyHandoff, the seconds the
// front end should allow for the takeover, and the process that takes it
// over removes the mark; a front end that sees the mark stay longer fails.

// KeyHandoff is the back end's key saying its device is being handed to
// another back-end process: the value is the seconds the takeover may take.
const KeyHandoff = "handoff"

// maxHandoffSeconds bounds the mark's value as a front end reads it.
const maxHandoffSeconds = 3600

// MarkHandoff marks the back end as handed over: a process must take the
// device over (and ClearHandoff) within within.
func (b *Back) MarkHandoff(ctx context.Context, within time.Duration) error {
	secs := max(int64(within/time.Second), 1)
	if secs > maxHandoffSeconds {
		return fmt.Errorf("xenbus: handoff bound %v: at most %ds", within, maxHandoffSeconds)
	}
	if err := b.xs.Write(ctx, b.own+"/"+KeyHandoff, strconv.FormatInt(secs, 10)); err != nil {
		return fmt.Errorf("xenbus: marking %s handed over: %w", b.own, err)
	}
	return nil
}

// ClearHandoff removes the mark: this process took the device over. No
// mark is not an error.
func (b *Back) ClearHandoff(ctx context.Context) error {
	if err := b.xs.Rm(ctx, b.own+"/"+KeyHandoff); err != nil && !isNotExist(err) {
		return fmt.Errorf("xenbus: clearing %s's handoff mark: %w", b.own, err)
	}
	return nil
}

// PeerHandoff reads the back end's handoff mark: the time its takeover
// may take, and whether there is one. A value that is not a number of
// seconds in 1..3600 is an error.
func (f *Front) PeerHandoff(ctx context.Context) (time.Duration, bool, error) {
	v, err := readNumber(ctx, f.xs, f.peer, KeyHandoff, 1, maxHandoffSeconds)
	if isNotExist(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return time.Duration(v) * time.Second, true, nil
}
