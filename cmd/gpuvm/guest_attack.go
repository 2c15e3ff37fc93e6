package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpuvm/gpuvm/pvdrm"
	"github.com/gpuvm/gpuvm/xen/xenbus"
	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// A pvdrmAttack is a hostile pvdrm front end (gpuvm guest --attack): an
// isolation test run from inside a Xen guest against the back end in dom0.
// Each either forges what the front end publishes at the handshake, which
// the back end must refuse (it never connects), or breaks the ring once
// connected, which must end the session (the back end lets go of the ring).
type pvdrmAttack struct {
	desc string
	// forge edits the GART directory and the published keys (handshake
	// attacks).
	forge func(dir []byte, extra []xenbus.Extra) []xenbus.Extra
	// connected runs on the connected ring (ring attacks).
	connected func(x *pvdrm.XenFront) error
}

// setExtra returns extra with key's value replaced.
func setExtra(extra []xenbus.Extra, key string, v uint64) []xenbus.Extra {
	out := slices.Clone(extra)
	for i := range out {
		if out[i].Key == key {
			out[i].Value = v
		}
	}
	return out
}

// extraValue returns key's value in extra.
func extraValue(extra []xenbus.Extra, key string) uint64 {
	for _, e := range extra {
		if e.Key == key {
			return e.Value
		}
	}
	return 0
}

// pvdrmAttacks are the attacks by name.
func pvdrmAttacks() map[string]pvdrmAttack {
	word := func(off int, v uint32) func([]byte, []xenbus.Extra) []xenbus.Extra {
		return func(dir []byte, extra []xenbus.Extra) []xenbus.Extra {
			binary.LittleEndian.PutUint32(dir[off:], v)
			return extra
		}
	}
	return map[string]pvdrmAttack{
		"gart-count": {desc: "a GART directory page that claims more references than a page holds",
			forge: word(4, 5000)},
		"gart-reserved-ref": {desc: "a heap page named by a reserved grant reference (2, the toolstack's)",
			forge: word(8, 2)},
		"gart-forged-ref": {desc: "a heap page named by a grant reference this domain never granted",
			forge: word(8, 0xFFFF0)},
		"gart-chain-loop": {desc: "a GART directory whose next-page link points back at its first page",
			forge: func(dir []byte, extra []xenbus.Extra) []xenbus.Extra {
				binary.LittleEndian.PutUint32(dir[0:], uint32(extraValue(extra, "gart-ref")))
				return extra
			}},
		"gart-dir-forged": {desc: "a GART directory reference this domain never granted",
			forge: func(_ []byte, extra []xenbus.Extra) []xenbus.Extra { return setExtra(extra, "gart-ref", 0xFFFF1) }},
		"gart-too-big": {desc: "a GART heap that claims more pages than the back end accepts",
			forge: func(_ []byte, extra []xenbus.Extra) []xenbus.Extra {
				return setExtra(extra, "gart-pages", pvdrm.MaxXenGARTPages+1)
			}},
		"ring-index": {desc: "a request producer index that runs past the ring, once connected",
			connected: func(x *pvdrm.XenFront) error {
				binary.LittleEndian.PutUint32(x.Ring()[0:], 1<<30) // io/ring.h: req_prod first
				return x.Notify()
			}},
	}
}

// pvdrmAttackNames lists the attacks, sorted.
func pvdrmAttackNames() []string {
	var n []string
	for k := range pvdrmAttacks() {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

// runGuestAttack runs one attack and says how the back end answered: exit
// 0 when it refused (handshake) or dropped the ring (ring attack), 1 when
// it went along.
func runGuestAttack(c *cli.Context, f *guestFlags, name string) error {
	a, ok := pvdrmAttacks()[name]
	if !ok {
		return usageError("--attack %q: want one of %s", name, strings.Join(pvdrmAttackNames(), ", "))
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("connect-timeout"))
	defer cancel()
	xs, err := xenstore.Open()
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	defer xs.Close()
	domid, err := xenbus.SelfDomid(ctx, xs)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(c.App.ErrWriter, "guest: attack %s: "+format+"\n", append([]any{name}, args...)...)
	}
	say("%s", a.desc)
	x, err := pvdrm.NewXenFront(ctx, pvdrm.XenFrontConfig{Xenstore: xs, Domid: domid, DevID: uint32(c.Uint("devid")),
		DevDir: c.Path("xen-dir"), GARTPages: int(f.gartSize / 4096), Forge: a.forge})
	if a.forge != nil {
		if err == nil {
			_ = x.Close()
			return &exitError{code: exitFailure, err: fmt.Errorf("attack %s: the back end connected", name)}
		}
		if !errors.Is(err, xenbus.ErrPeerClosed) {
			return &exitError{code: exitFailure, err: fmt.Errorf("attack %s: not refused by the back end: %w", name, err)}
		}
		say("refused: the back end closed the device (%v)", err)
		return nil
	}
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("attack %s: the honest handshake failed: %w", name, err)}
	}
	defer x.Close()
	if err := a.connected(x); err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		st, err := x.Xenbus().PeerState(ctx)
		if x.PeerGone() || (err == nil && st != xenbus.StateConnected) {
			say("the back end dropped the ring after %v (back end %v)", time.Since(start).Round(time.Millisecond), st)
			return nil
		}
	}
	return &exitError{code: exitFailure, err: fmt.Errorf("attack %s: the back end still serves the broken ring after 10 s", name)}
}
