package ipc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary re-executes itself as a helper process (a device-model
// client, an aggregator server, or a bare ping-pong peer) when this variable
// names a role, so that fd passing and shared memory cross a real process
// boundary.
const helperEnv = "GPUVM_IPC_TEST_HELPER"

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		if err := runHelper(role); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func runHelper(role string) error {
	sock := os.Getenv("SOCK")
	tr := Transport(envInt("TRANSPORT", int(TransportShm)))
	spin := envInt("SPIN", DefaultSpin)
	switch role {
	case "client":
		return helperClient(sock, tr, spin)
	case "client-hang":
		ram, err := CreateMemfd("child-ram", 1<<20)
		if err != nil {
			return err
		}
		c, _, _, err := Dial(context.Background(), sock, testHello("hang", tr), ram, nil, nil)
		if err != nil {
			return err
		}
		if err := c.Write32(0, 0x1700, 42); err != nil {
			return err
		}
		if _, err := c.Read32(0, 0x1700); err != nil {
			return err
		}
		fmt.Println("ready")
		time.Sleep(time.Hour) // until killed
		return nil
	case "server":
		l, err := Listen(sock, &ListenOptions{Spin: spin})
		if err != nil {
			return err
		}
		fmt.Println("ready")
		for {
			p, err := l.Accept(context.Background())
			if err != nil {
				return err
			}
			sc, err := p.Accept(Welcome{VGPU: 1, VRAMSize: 1 << 30, Channels: 16}, nil)
			if err != nil {
				return err
			}
			go func() {
				sc.Serve(context.Background(), newRegs())
				sc.Close()
			}()
		}
	case "pingpong-shm":
		// fd 3: a memfd; word 0 (client) and word 16 (one cache line on)
		// carry sequence numbers; spin, echo.
		mem, err := unix.Mmap(3, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		ping := (*uint32)(unsafe.Pointer(&mem[0]))
		pong := (*uint32)(unsafe.Pointer(&mem[64]))
		quit := (*uint32)(unsafe.Pointer(&mem[128]))
		last := uint32(0)
		for atomic.LoadUint32(quit) == 0 {
			if v := atomic.LoadUint32(ping); v != last {
				last = v
				atomic.StoreUint32(pong, v)
			}
		}
		return nil
	case "pingpong-sock":
		f := os.NewFile(3, "sock")
		b := make([]byte, EntrySize)
		for {
			n, err := f.Read(b)
			if err != nil || n == 0 {
				return nil
			}
			if _, err := f.Write(b[:n]); err != nil {
				return nil
			}
		}
	}
	return fmt.Errorf("unknown helper role %q", role)
}

// helperClient is the device model side of TestCrossProcess.
func helperClient(sock string, tr Transport, spin int) error {
	ram, err := CreateMemfd("child-ram", 1<<20)
	if err != nil {
		return err
	}
	if _, err := ram.WriteAt([]byte("written before dial"), 4096); err != nil {
		return err
	}
	mem, err := unix.Mmap(int(ram.Fd()), 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	c, w, files, err := Dial(context.Background(), sock, testHello("child", tr), ram, nil, &DialOptions{Spin: spin})
	if err != nil {
		return err
	}
	defer c.Close()
	if w.Params["pid"] != strconv.Itoa(os.Getppid()) {
		return fmt.Errorf("welcome params %v", w.Params)
	}
	if len(files) != 1 {
		return fmt.Errorf("%d extra files", len(files))
	}
	b := make([]byte, 12)
	files[0].ReadAt(b, 0)
	if string(b) != "server-extra" {
		return fmt.Errorf("server extra file reads %q", b)
	}
	copy(mem[8192:], "written after dial")
	for i := uint32(0); i < 1000; i++ {
		if err := c.Write32(1, uint64(4*i), i*7); err != nil {
			return err
		}
	}
	for i := uint32(0); i < 1000; i += 97 {
		v, err := c.Read32(1, uint64(4*i))
		if err != nil {
			return err
		}
		if v != i*7 {
			return fmt.Errorf("read %d, want %d", v, i*7)
		}
	}
	// Op 3 makes the aggregator read our RAM through its own mapping.
	r, err := c.Call(3, 8192)
	if err != nil {
		return err
	}
	if got := string(unsafe.Slice((*byte)(unsafe.Pointer(&r.Result[0])), 18)); got != "written after dial" {
		return fmt.Errorf("aggregator read %q from guest RAM", got)
	}
	return nil
}

// ramHandler is regs plus op 3: return 24 bytes of guest RAM at args[0].
type ramHandler struct {
	*regs
	ram []byte
}

func (h ramHandler) Call(op uint16, args []uint64) (CallResult, error) {
	if op != 3 {
		return h.regs.Call(op, args)
	}
	var r CallResult
	if len(args) != 1 || args[0] > uint64(len(h.ram))-24 {
		return r, errors.New("bad RAM offset")
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&r.Result[0])), 24), h.ram[args[0]:])
	return r, nil
}

func helperCmd(t testing.TB, role string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestCrossProcess: the device model is another process. Its RAM memfd and
// the ring memfd cross the boundary; the aggregator reads guest RAM the
// child wrote after the handshake; Serve ends when the child exits.
func TestCrossProcess(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		path := t.TempDir() + "/x.sock"
		l, err := Listen(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cmd := helperCmd(t, "client", "SOCK="+path, fmt.Sprintf("TRANSPORT=%d", tr))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		p, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Peer().PID != int32(cmd.Process.Pid) {
			t.Errorf("peer pid %d, child is %d", p.Peer().PID, cmd.Process.Pid)
		}
		ram, err := unix.Mmap(int(p.RAM().Fd()), 0, int(p.Hello().RAMSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(ram)
		if got := string(ram[4096 : 4096+19]); got != "written before dial" {
			t.Fatalf("guest RAM reads %q", got)
		}
		extra := testRAM(t, 4096)
		extra.WriteAt([]byte("server-extra"), 0)
		sc, err := p.Accept(Welcome{VGPU: 3, Params: map[string]string{"pid": strconv.Itoa(os.Getpid())}}, []*os.File{extra})
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		h := ramHandler{regs: newRegs(), ram: ram}
		serr := sc.Serve(ctx, h)
		if !errors.Is(serr, ErrPeerClosed) {
			t.Errorf("Serve = %v, want ErrPeerClosed", serr)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("client process: %v", err)
		}
		if v := h.m[[2]uint64{1, 4 * 999}]; v != 999*7 {
			t.Fatalf("handler register = %d", v)
		}
	})
}

// startHelper starts a helper that prints "ready" and returns it.
func startHelper(t testing.TB, role string, extra []*os.File, env ...string) *exec.Cmd {
	t.Helper()
	cmd := helperCmd(t, role, env...)
	cmd.ExtraFiles = extra
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if role == "server" || role == "client-hang" {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			t.Fatalf("helper %s: %q, %v", role, line, err)
		}
	}
	return cmd
}

// TestKilledClient: SIGKILL the device model; Serve returns promptly even
// though the server was asleep on its futex.
func TestKilledClient(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		ts := startServer(t, &ListenOptions{Spin: 10})
		cmd := startHelper(t, "client-hang", nil, "SOCK="+ts.path, fmt.Sprintf("TRANSPORT=%d", tr))
		s := ts.accepted()
		time.Sleep(50 * time.Millisecond) // let the server fall asleep
		start := time.Now()
		cmd.Process.Signal(syscall.SIGKILL)
		if err := s.wait(t); !errors.Is(err, ErrPeerClosed) {
			t.Fatalf("Serve = %v, want ErrPeerClosed", err)
		}
		t.Logf("Serve returned %v after SIGKILL", time.Since(start))
		if v := s.h.m[[2]uint64{0, 0x1700}]; v != 42 {
			t.Fatalf("handler register = %d", v)
		}
	})
}

// TestKilledServer: SIGKILL the aggregator; the client's calls fail instead
// of hanging, including one that is already waiting for its reply.
func TestKilledServer(t *testing.T) {
	forTransports(t, func(t *testing.T, tr Transport) {
		path := t.TempDir() + "/k.sock"
		cmd := startHelper(t, "server", nil, "SOCK="+path, "SPIN=10")
		c, _, files, err := Dial(context.Background(), path, testHello("vm", tr), testRAM(t, 1<<20), nil, &DialOptions{Spin: 10})
		if err != nil {
			t.Fatal(err)
		}
		closeFiles(files)
		defer c.Close()
		checkHonest(t, c)
		cmd.Process.Signal(syscall.SIGKILL)
		done := make(chan error, 1)
		go func() {
			var err error
			for err == nil {
				_, err = c.Read32(0, 0)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrPeerClosed) {
				t.Fatalf("client error %v, want ErrPeerClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("client hangs after the server died")
		}
		if err := c.Write32(0, 0, 0); !errors.Is(err, ErrPeerClosed) {
			t.Fatalf("write after server death: %v", err)
		}
	})
}
