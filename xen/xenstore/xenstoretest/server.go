// Package xenstoretest is an in-process xenstore daemon for tests: a test
// double for machines without Xen (where there is no xenstored), as
// net/http/httptest is for HTTP servers. A Server speaks the wire protocol
// of package xenstore over net.Pipe, one connection per client, each
// client as a domain of its choosing.
//
// It keeps a flat tree of nodes, fires watches (an initial event and one
// per change at or below the watched path, or above a removed one), and
// runs transactions on a private copy of the tree that commits only if
// nothing else committed meanwhile (else EAGAIN, as xenstored does).
// Permissions are stored but not enforced, and requests other than those a
// client of package xenstore sends are refused with ENOSYS. It also keeps a
// log of every state a split driver switched to (StateLog) and can refuse
// commits on demand (FailCommits), for the tests of xen/xenbus and of the
// drivers built on it.
package xenstoretest

import (
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/gpuvm/gpuvm/xen/xenstore"
)

// Server is an in-process xenstore daemon. Its methods are safe for
// concurrent use.
type Server struct {
	mu          sync.Mutex
	nodes       map[string]string
	perms       map[string][]string
	gen         uint64
	txs         map[uint32]*transaction
	nextTx      uint32
	conns       []*conn
	failCommits int      // answer this many commits with EAGAIN
	states      []string // every committed write of a .../state node: "<dir>=<value>"
}

// transaction is an open transaction: a private copy of the tree.
type transaction struct {
	nodes   map[string]string
	gen     uint64
	changed []string
}

// conn is one client's connection.
type conn struct {
	s       *Server
	domid   uint16
	c       net.Conn
	wmu     sync.Mutex
	watches map[string]string // token -> absolute path
}

// NewServer returns a daemon whose tree holds only the root, "/".
func NewServer() *Server {
	return &Server{nodes: map[string]string{"/": ""}, perms: map[string][]string{}, txs: map[uint32]*transaction{}}
}

// Connect returns a client connected as domain domid: its relative paths
// are under /local/domain/<domid>. The connection is closed when the test
// ends.
func (s *Server) Connect(t testing.TB, domid uint16) *xenstore.Client {
	t.Helper()
	cli, srv := net.Pipe()
	c := &conn{s: s, domid: domid, c: srv, watches: map[string]string{}}
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	go c.serve()
	xs := xenstore.NewClient(cli)
	t.Cleanup(func() { xs.Close(); srv.Close() })
	return xs
}

// Get returns the value of node p (an absolute path) and whether it
// exists, outside any transaction.
func (s *Server) Get(p string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.nodes[p]
	return v, ok
}

// Set writes node p (an absolute path) directly, as a hostile or absent
// peer would, and fires its watches. Its parents are not created.
func (s *Server) Set(p, v string) {
	s.mu.Lock()
	s.nodes[p] = v
	s.gen++
	ev := s.fire([]string{p})
	s.mu.Unlock()
	for _, e := range ev {
		e.conn.send(xenstore.Msg{Type: xenstore.MsgWatchEvent, Payload: []byte(e.path + "\x00" + e.tok + "\x00")})
	}
}

// Perms returns the permission list last set on node p, as XS_SET_PERMS
// sent it (e.g. "n5", "r0"), or nil.
func (s *Server) Perms(p string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.perms[p]...)
}

// StateLog returns every committed write of a node named state, in order,
// as "<directory>=<value>": the states the ends of split drivers switched
// to.
func (s *Server) StateLog() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.states...)
}

// FailCommits makes the next n commits fail with EAGAIN, as if another
// commit had touched the same nodes.
func (s *Server) FailCommits(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCommits = n
}

// OpenTransactions returns how many transactions were started and not yet
// ended.
func (s *Server) OpenTransactions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.txs)
}

// send writes one message to the client.
func (c *conn) send(m xenstore.Msg) {
	b, err := m.Marshal()
	if err != nil {
		panic(err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.c.Write(b) // a closed client ends the test anyway
}

// event is a watch event to send to a connection.
type event struct {
	conn *conn
	path string
	tok  string
}

// serve answers the client's requests until the connection ends.
func (c *conn) serve() {
	for {
		m, err := xenstore.ReadMsg(c.c)
		if err != nil {
			c.c.Close()
			return
		}
		reply, events := c.handle(m)
		c.send(reply)
		for _, e := range events {
			e.conn.send(xenstore.Msg{Type: xenstore.MsgWatchEvent, Payload: []byte(e.path + "\x00" + e.tok + "\x00")})
		}
	}
}

// abs makes a path relative to the client's domain absolute.
func (c *conn) abs(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return fmt.Sprintf("/local/domain/%d/%s", c.domid, p)
}

// handle runs one request and returns the reply and the watch events it
// fired.
func (c *conn) handle(m xenstore.Msg) (xenstore.Msg, []event) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(errno string) (xenstore.Msg, []event) {
		return xenstore.Msg{Type: xenstore.MsgError, ReqID: m.ReqID, TxID: m.TxID, Payload: []byte(errno + "\x00")}, nil
	}
	ok := func(p string, ev []event) (xenstore.Msg, []event) {
		return xenstore.Msg{Type: m.Type, ReqID: m.ReqID, TxID: m.TxID, Payload: []byte(p)}, ev
	}
	args := strings.Split(string(m.Payload), "\x00")
	nodes, tx := s.nodes, (*transaction)(nil)
	if m.TxID != 0 {
		if tx = s.txs[m.TxID]; tx == nil {
			return fail("ENOENT")
		}
		nodes = tx.nodes
	}
	var changed []string
	switch m.Type {
	case xenstore.MsgRead:
		v, found := nodes[c.abs(args[0])]
		if !found {
			return fail("ENOENT")
		}
		return ok(v, nil)
	case xenstore.MsgWrite, xenstore.MsgMkdir:
		p := c.abs(args[0])
		for q := p; q != ""; q = q[:max(strings.LastIndexByte(q, '/'), 0)] {
			if _, found := nodes[q]; !found {
				nodes[q] = "" // parents are created as in xenstored
			}
		}
		if m.Type == xenstore.MsgWrite {
			nodes[p] = strings.Join(args[1:], "\x00")
		}
		changed = append(changed, p)
	case xenstore.MsgRm:
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
	case xenstore.MsgDirectory:
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
	case xenstore.MsgSetPerms:
		if len(args) < 2 {
			return fail("EINVAL")
		}
		p := c.abs(args[0])
		if _, found := nodes[p]; !found {
			return fail("ENOENT")
		}
		s.perms[p] = args[1 : len(args)-1] // the payload ends with a NUL
		changed = append(changed, p)
	case xenstore.MsgGetDomainPath:
		return ok("/local/domain/"+args[0]+"\x00", nil)
	case xenstore.MsgWatch, xenstore.MsgUnwatch:
		if len(args) < 2 {
			return fail("EINVAL")
		}
		if m.Type == xenstore.MsgUnwatch {
			delete(c.watches, args[1])
			return ok("OK\x00", nil)
		}
		c.watches[args[1]] = c.abs(args[0])
		return ok("OK\x00", []event{{c, args[0], args[1]}})
	case xenstore.MsgTransactionStart:
		s.nextTx++
		cp := make(map[string]string, len(s.nodes))
		for k, v := range s.nodes {
			cp[k] = v
		}
		s.txs[s.nextTx] = &transaction{nodes: cp, gen: s.gen}
		return ok(fmt.Sprintf("%d\x00", s.nextTx), nil)
	case xenstore.MsgTransactionEnd:
		if tx == nil {
			return fail("EINVAL")
		}
		delete(s.txs, m.TxID)
		if args[0] != "T" {
			return ok("OK\x00", nil)
		}
		if s.failCommits > 0 || tx.gen != s.gen {
			if s.failCommits > 0 {
				s.failCommits--
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
func (s *Server) fire(paths []string) []event {
	for _, p := range paths {
		if v, ok := s.nodes[p]; ok && strings.HasSuffix(p, "/state") {
			s.states = append(s.states, strings.TrimSuffix(p, "/state")+"="+v)
		}
	}
	return s.events(paths)
}

// events returns the events for changes at paths: to every watch at or above
// a changed node, or below a removed one.
func (s *Server) events(paths []string) []event {
	var ev []event
	for _, p := range paths {
		for _, c := range s.conns {
			for tok, w := range c.watches {
				if p == w || strings.HasPrefix(p, w+"/") || strings.HasPrefix(w, p+"/") {
					ev = append(ev, event{c, p, tok})
				}
			}
		}
	}
	return ev
}
