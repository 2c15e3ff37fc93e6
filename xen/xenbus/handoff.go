package xenbus

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gpuvm/gpuvm/xen/xenstore"
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
// another back-end process: the value is the seconds the takeover may take
// (decimal, 1..3600; a front end fails on any other value).
const KeyHandoff = "handoff"

// KeyHandoffID names each mark: written anew with every MarkHandoff, so a
// front end tells a mark written again (a second handoff right after a
// takeover) from one that stayed, and counts it afresh.
const KeyHandoffID = "handoff-id"

// maxHandoffSeconds bounds the mark's value as a front end reads it.
const maxHandoffSeconds = 3600

// MarkHandoff marks the back end as handed over: a process must take the
// device over (and ClearHandoff) within within.
func (b *Back) MarkHandoff(ctx context.Context, within time.Duration) error {
	secs := max(int64(within/time.Second), 1)
	if secs > maxHandoffSeconds {
		return fmt.Errorf("xenbus: handoff bound %v: at most %ds", within, maxHandoffSeconds)
	}
	id := strconv.FormatInt(time.Now().UnixNano(), 10)
	err := b.xs.Transaction(ctx, func(tx xenstore.Tx) error {
		// Only into a directory that is there: a device removed
		// meanwhile is not made again.
		if _, err := tx.Read(ctx, b.own+"/state"); err != nil {
			return err
		}
		if err := tx.Write(ctx, b.own+"/"+KeyHandoffID, id); err != nil {
			return err
		}
		return tx.Write(ctx, b.own+"/"+KeyHandoff, strconv.FormatInt(secs, 10))
	})
	if err != nil {
		return fmt.Errorf("xenbus: marking %s handed over: %w", b.own, err)
	}
	return nil
}

// ClearHandoff removes the mark: this process took the device over. No
// mark is not an error.
func (b *Back) ClearHandoff(ctx context.Context) error {
	for _, k := range []string{KeyHandoff, KeyHandoffID} {
		if err := b.xs.Rm(ctx, b.own+"/"+k); err != nil && !isNotExist(err) {
			return fmt.Errorf("xenbus: clearing %s's handoff mark: %w", b.own, err)
		}
	}
	return nil
}

// HandoffMark is a back end's handoff mark as its front end reads it.
type HandoffMark struct {
	Within time.Duration // the time the takeover may take
	ID     string        // which mark (KeyHandoffID)
}

// PeerHandoff reads the back end's handoff mark, and whether there is
// one. A value that is not a number of seconds in 1..3600 is an error.
func (f *Front) PeerHandoff(ctx context.Context) (HandoffMark, bool, error) {
	var m HandoffMark
	var ok bool
	err := f.xs.Transaction(ctx, func(tx xenstore.Tx) error {
		m, ok = HandoffMark{}, false
		v, err := readNumber(ctx, tx, f.peer, KeyHandoff, 1, maxHandoffSeconds)
		if isNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		id, err := tx.Read(ctx, f.peer+"/"+KeyHandoffID)
		if err != nil && !isNotExist(err) {
			return err
		}
		m, ok = HandoffMark{Within: time.Duration(v) * time.Second, ID: id}, true
		return nil
	})
	if err != nil {
		return HandoffMark{}, false, fmt.Errorf("xenbus: %s's handoff mark: %w", f.peer, err)
	}
	return m, ok, nil
}
