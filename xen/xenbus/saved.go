package xenbus

import (
	"context"
	"fmt"

	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// A device across a save of its back end's state (docs/pvdrm.md §8, "A device across a save").
// The back end saved what it serves (a state image) and let go of the
// ring; before it unmaps, it marks its directory saved (KeySaved), so that
// its front end, seeing its back end go, knows to keep its own state and
// wait rather than fail. A back end that restores the image later, here
// or in the domain xl restore made, offers the device with KeyResume: the
// front end grants its ring again, with what was on it, and goes on.

// KeySaved in a back end's directory says it saved its state and let go
// of the ring (Back.MarkSaved).
const KeySaved = "saved"

// KeyResume in a back end's directory says it restores a saved state: it
// expects the front end's ring as the save left it (StartBackResuming).
const KeyResume = "resume"

// MarkSaved marks the back end's directory saved: the back end let go of
// the ring (or is about to) and its state is in an image, to be restored
// by a resuming back end. Only into a directory that is there.
func (b *Back) MarkSaved(ctx context.Context) error {
	err := b.xs.Transaction(ctx, func(tx xenstore.Tx) error {
		if _, err := tx.Read(ctx, b.own+"/state"); err != nil {
			return err
		}
		return tx.Write(ctx, b.own+"/"+KeySaved, "1")
	})
	if err != nil {
		return fmt.Errorf("xenbus: marking %s saved: %w", b.own, err)
	}
	return nil
}

// PeerSaved reports whether the back end marked its directory saved.
func (f *Front) PeerSaved(ctx context.Context) (bool, error) {
	return peerFlag(ctx, f.xs, f.peer, KeySaved)
}

// PeerResumes reports whether the back end offers the device to resume a
// saved state (KeyResume).
func (f *Front) PeerResumes(ctx context.Context) (bool, error) {
	return peerFlag(ctx, f.xs, f.peer, KeyResume)
}

// peerFlag reads dir/key, a flag that is 1 or not there.
func peerFlag(ctx context.Context, xs *xenstore.Client, dir, key string) (bool, error) {
	_, err := readNumber(ctx, xs, dir, key, 1, 1)
	switch {
	case isNotExist(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("xenbus: %s/%s: %w", dir, key, err)
	}
	return true, nil
}
