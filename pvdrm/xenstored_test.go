package pvdrm

import (
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
)

// testXenstored is a small in-process xenstore daemon speaking the wire
// protocol over net.Pipe, for the tests: there is no xenstored on a
// machine without Xen. It keeps a flat tree of nodes, fires watches
// (an initial event and one per change at or below the watched path), and
// runs transactions on a private copy of the tree that commits only if
// nothing else committed meanwhile (else EAGAIN, as xenstored does).
// Permissions are stored but not enforced.
type testXenstored struct {
	mu       sync.Mutex
	nodes    map[string]string
	perms    map[string]string
	gen      uint64
	txs      map[uint32]*testXsTx
	nextTx   uint32
	conns    []*testXsConn
	failEnds int      // answer this many commits with EAGAIN
	states   []string // every committed write of a .../state node: "<dir>=<value>"
}

type testXsTx struct {
	nodes   map[string]string
	gen     uint64
	changed []string
}

type testXsConn struct {
	s       *testXenstored
	domid   uint16
	c       net.Conn
	wmu     sync.Mutex
	watches map[string]string // token -> absolute path
}

func newTestXenstored() *testXenstored {
	return &testXenstored{nodes: map[string]string{"/": ""}, perms: map[string]string{}, txs: map[uint32]*testXsTx{}}
}

// connect returns a client connected as domain domid.
func (s *testXenstored) connect(t *testing.T, domid uint16) *Xenstore {
	t.Helper()
	cli, srv := net.Pipe()
	conn := &testXsConn{s: s, domid: domid, c: srv, watches: map[string]string{}}
	s.mu.Lock()
	s.conns = append(s.conns, conn)
	s.mu.Unlock()
	go conn.serve()
	xs := NewXenstore(cli)
	t.Cleanup(func() { xs.Close(); srv.Close() })
	return xs
}

func (s *testXenstored) get(p string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.nodes[p]
	return v, ok
}

// set writes a node directly (as a hostile or absent peer would) and fires
// its watches.
func (s *testXenstored) set(p, v string) {
	s.mu.Lock()
	s.nodes[p] = v
	s.gen++
	ev := s.fire([]string{p})
	s.mu.Unlock()
	for _, e := range ev {
		e.conn.send(xsMsg{Type: xsWatchEvent, Payload: []byte(e.path + "\x00" + e.tok + "\x00")})
	}
}

func (s *testXenstored) stateLog() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.states...)
}

func (c *testXsConn) send(m xsMsg) {
	b, err := m.marshal()
	if err != nil {
		panic(err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.c.Write(b) // a closed client ends the test anyway
}

type testXsEvent struct {
	conn *testXsConn
	path string
	tok  string
}

func (c *testXsConn) serve() {
	for {
		m, err := readXsMsg(c.c)
		if err != nil {
			c.c.Close()
			return
		}
		reply, events := c.handle(m)
		c.send(reply)
		for _, e := range events {
			e.conn.send(xsMsg{Type: xsWatchEvent, Payload: []byte(e.path + "\x00" + e.tok + "\x00")})
		}
	}
}

func (c *testXsConn) abs(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return fmt.Sprintf("/local/domain/%d/%s", c.domid, p)
}

// handle runs one request and returns the reply and the watch events it
// fired.
func (c *testXsConn) handle(m xsMsg) (xsMsg, []testXsEvent) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(errno string) (xsMsg, []testXsEvent) {
		return xsMsg{Type: xsError, ReqID: m.ReqID, TxID: m.TxID, Payload: []byte(errno + "\x00")}, nil
	}
	ok := func(p string, ev []testXsEvent) (xsMsg, []testXsEvent) {
		return xsMsg{Type: m.Type, ReqID: m.ReqID, TxID: m.TxID, Payload: []byte(p)}, ev
	}
	args := strings.Split(string(m.Payload), "\x00")
	nodes, tx := s.nodes, (*testXsTx)(nil)
	if m.TxID != 0 {
		if tx = s.txs[m.TxID]; tx == nil {
			return fail("ENOENT")
		}
		nodes = tx.nodes
	}
	var changed []string
	switch m.Type {
	case xsRead:
		v, found := nodes[c.abs(args[0])]
		if !found {
			return fail("ENOENT")
		}
		return ok(v, nil)
	case xsWrite, xsMkdir:
		p := c.abs(args[0])
		for q := p; q != ""; q = q[:max(strings.LastIndexByte(q, '/'), 0)] {
			if _, found := nodes[q]; !found {
				nodes[q] = "" // parents are created as in xenstored
			}
		}
		if m.Type == xsWrite {
			nodes[p] = strings.Join(args[1:], "\x00")
		}
		changed = append(changed, p)
	case xsRm:
		p := c.abs(args[0])
		if _, found := nodes[p]; !found {
			return fail("ENOENT")
		}
		for q := range nodes {
			if q == p || strings.HasPrefix(q, p+"/") {
				delete(nodes, q)
			}
		}
		changed = append(changed, p)
	case xsDirectory:
		p := c.abs(args[0])
		if _, found := nodes[p]; !found {
			return fail("ENOENT")
		}
		var kids []string
		for q := range nodes {
			if rest, cut := strings.CutPrefix(q, p+"/"); cut && !strings.Contains(rest, "/") {
				kids = append(kids, rest+"\x00")
			}
		}
		sort.Strings(kids)
		return ok(strings.Join(kids, ""), nil)
	case xsSetPerms:
		p := c.abs(args[0])
		if _, found := nodes[p]; !found {
			return fail("ENOENT")
		}
		s.perms[p] = strings.Join(args[1:], ",")
		changed = append(changed, p)
	case xsGetDomainPath:
		return ok("/local/domain/"+args[0]+"\x00", nil)
	case xsWatch:
		c.watches[args[1]] = c.abs(args[0])
		return ok("OK\x00", []testXsEvent{{c, args[0], args[1]}})
	case xsUnwatch:
		delete(c.watches, args[1])
		return ok("OK\x00", nil)
	case xsTransactionStart:
		s.nextTx++
		cp := make(map[string]string, len(s.nodes))
		for k, v := range s.nodes {
			cp[k] = v
		}
		s.txs[s.nextTx] = &testXsTx{nodes: cp, gen: s.gen}
		return ok(fmt.Sprintf("%d\x00", s.nextTx), nil)
	case xsTransactionEnd:
		if tx == nil {
			return fail("EINVAL")
		}
		delete(s.txs, m.TxID)
		if args[0] != "T" {
			return ok("OK\x00", nil)
		}
		if s.failEnds > 0 || tx.gen != s.gen {
			if s.failEnds > 0 {
				s.failEnds--
			}
			return fail("EAGAIN")
		}
		s.nodes = tx.nodes
		if len(tx.changed) > 0 {
			s.gen++
		}
		return ok("OK\x00", s.fire(tx.changed))
	default:
		return fail("ENOSYS")
	}
	if tx != nil {
		tx.changed = append(tx.changed, changed...)
		return ok("OK\x00", nil)
	}
	s.gen++
	return ok("OK\x00", s.fire(changed))
}

// fire logs the state changes at paths and returns their events.
func (s *testXenstored) fire(paths []string) []testXsEvent {
	for _, p := range paths {
		if v, ok := s.nodes[p]; ok && strings.HasSuffix(p, "/state") {
			s.states = append(s.states, strings.TrimSuffix(p, "/state")+"="+v)
		}
	}
	return s.events(paths)
}

// events returns the events for changes at paths: to every watch at or above
// a changed node, or below a removed one.
func (s *testXenstored) events(paths []string) []testXsEvent {
	var ev []testXsEvent
	for _, p := range paths {
		for _, c := range s.conns {
			for tok, w := range c.watches {
				if p == w || strings.HasPrefix(p, w+"/") || strings.HasPrefix(w, p+"/") {
					ev = append(ev, testXsEvent{c, p, tok})
				}
			}
		}
	}
	return ev
}
