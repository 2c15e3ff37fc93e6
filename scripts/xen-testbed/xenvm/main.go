// Command xenvm boots the Xen test bed that scripts/xen-testbed/build makes
// under QEMU's TCG and drives dom0's serial console: it waits for the dom0
// shell, runs commands in it one at a time (each with a time limit, its
// output and exit status captured through a unique marker), and powers the
// machine off. Every byte of the console goes, timestamped from QEMU's
// start, into a log file.
//
//	go run ./scripts/xen-testbed/xenvm [flags]      (or scripts/xenvm)
//	    -cmd 'xl info'          run a command in dom0 (repeatable, in order)
//	    -script FILE            run FILE in dom0 (copied to the share, run with sh)
//	    -keep                   then leave the console to the terminal
//
// QEMU loads Xen by multiboot: -kernel is Xen's ELF, -initrd the dom0
// kernel with its command line and then dom0's initramfs. The share
// directory is a 9p export (mount_tag host) that dom0 mounts at /host.
//
// Exit status: 0 when every command succeeded; 1 when one failed; 2 for a
// usage error; 3 when dom0 did not come up; 4 when the console stopped
// answering; 130 when interrupted.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	exitFailed      = 1
	exitUsage       = 2
	exitBoot        = 3
	exitConsoleLost = 4
	exitInterrupted = 130
)

// step is one thing to run in dom0: a --cmd or a --script.
type step struct {
	cmd    string // the shell command run in dom0 (shown and logged)
	script string // for --script: the host file, copied to the share first
	// typed is what is typed on the console to run it: a short line that
	// runs a file on the share (Xen drops serial input that does not fit
	// its 128-byte ring while dom0 is busy: a long command typed whole
	// could lose a byte — a quote — and hang the shell).
	typed string
}

type steps []step

type cmdFlag struct{ s *steps }

func (f cmdFlag) String() string { return "" }
func (f cmdFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty command")
	}
	*f.s = append(*f.s, step{cmd: v})
	return nil
}

type scriptFlag struct{ s *steps }

func (f scriptFlag) String() string { return "" }
func (f scriptFlag) Set(v string) error {
	if _, err := os.Stat(v); err != nil {
		return err
	}
	*f.s = append(*f.s, step{script: v})
	return nil
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	dir             string
	qemu            string
	cpu             string
	accel           string
	smp             int
	memMB           int
	dom0Mem         string
	xenArgs         string
	dom0Args        string
	qemuArgs        listFlag
	steps           steps
	keepGoing       bool
	keep            bool
	logPath         string
	results         string
	outDir          string
	bootTimeout     time.Duration
	cmdTimeout      time.Duration
	timeout         time.Duration
	shutdownTimeout time.Duration
	lockTimeout     time.Duration
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("xenvm", flag.ContinueOnError)
	defDir := os.Getenv("XTB_DIR")
	if defDir == "" {
		defDir = "build/xen-testbed"
	}
	fs.StringVar(&o.dir, "dir", defDir, "the test bed `directory` (xen, vmlinux, dom0.cpio, share/) that scripts/xen-testbed/build made")
	fs.StringVar(&o.qemu, "qemu", "qemu-system-x86_64", "QEMU `binary`")
	fs.StringVar(&o.cpu, "cpu", "max,-smap,-smep", "QEMU CPU model (TCG; SMAP/SMEP off or dom0 faults in create_bounce_frame)")
	fs.StringVar(&o.accel, "accel", "tcg,thread=multi", "QEMU accelerator")
	fs.IntVar(&o.smp, "smp", 2, "CPUs")
	fs.IntVar(&o.memMB, "mem", 3072, "machine memory in `MiB`")
	fs.StringVar(&o.dom0Mem, "dom0-mem", "1024M", "dom0's memory (Xen's dom0_mem)")
	fs.StringVar(&o.xenArgs, "xen-args", "", "more Xen command-line arguments")
	fs.StringVar(&o.dom0Args, "dom0-args", "", "more dom0 kernel command-line arguments")
	fs.Var(&o.qemuArgs, "qemu-arg", "one more QEMU argument (repeatable)")
	fs.Var(cmdFlag{&o.steps}, "cmd", "`command` to run in the dom0 shell (repeatable; in order with -script)")
	fs.Var(scriptFlag{&o.steps}, "script", "shell script `file` to run in dom0 (repeatable)")
	fs.BoolVar(&o.keepGoing, "keep-going", false, "run the remaining commands after one fails")
	fs.BoolVar(&o.keep, "keep", false, "after the commands, hand the console to the terminal (Ctrl-D powers off)")
	fs.StringVar(&o.logPath, "log", "", "console log `file` (default DIR/logs/console-TIME.log)")
	fs.StringVar(&o.results, "results", "", "write one line per command (n, rc, seconds, command) to `file`")
	fs.StringVar(&o.outDir, "out-dir", "", "write each command's output to `dir`/N.out")
	fs.DurationVar(&o.bootTimeout, "boot-timeout", 5*time.Minute, "time limit from QEMU's start to the dom0 shell")
	fs.DurationVar(&o.cmdTimeout, "cmd-timeout", 10*time.Minute, "time limit per command")
	fs.DurationVar(&o.timeout, "timeout", 45*time.Minute, "time limit for the whole run (not counting -keep)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", time.Minute, "time allowed for poweroff before QEMU is killed")
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 20*time.Minute, "how long to wait for another xenvm using the same directory")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: xenvm [flags]\n\nBoots the Xen test bed under QEMU TCG and runs commands in dom0.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (commands go in -cmd)", fs.Arg(0))
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "xenvm:", err)
		os.Exit(exitUsage)
	}
	os.Exit(run(o))
}

func say(format string, a ...any) {
	fmt.Printf("xenvm: "+format+"\n", a...)
}

// qemuEscape doubles commas: QEMU splits option values (and the multiboot
// module list in -initrd) on single ones.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func run(o *options) int {
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xenvm:", err)
		return exitUsage
	}
	xen, vmlinux, initrd, share := filepath.Join(dir, "xen"), filepath.Join(dir, "vmlinux"),
		filepath.Join(dir, "dom0.cpio"), filepath.Join(dir, "share")
	for _, f := range []string{xen, vmlinux, initrd, share} {
		if _, err := os.Stat(f); err != nil {
			fmt.Fprintf(os.Stderr, "xenvm: %v\n  build the test bed first: scripts/xen-testbed/build\n", err)
			return exitUsage
		}
	}
	if _, err := exec.LookPath(o.qemu); err != nil {
		fmt.Fprintf(os.Stderr, "xenvm: %v (package qemu-system-x86)\n", err)
		return exitUsage
	}
	// If whoever started us dies, we get SIGTERM and shut QEMU down.
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	interrupted := make(chan struct{})
	var interruptOnce sync.Once
	interactive := make(chan struct{}) // closed when -keep hands over the console
	var vmRef struct {
		sync.Mutex
		vm *vm
	}
	go func() {
		for s := range sigs {
			select {
			case <-interactive:
				if s == syscall.SIGINT {
					vmRef.Lock()
					if vmRef.vm != nil {
						_ = vmRef.vm.con.send("\x03")
					}
					vmRef.Unlock()
					continue
				}
			default:
			}
			fmt.Fprintf(os.Stderr, "xenvm: %v: shutting down\n", s)
			interruptOnce.Do(func() { close(interrupted) })
			cancel()
		}
	}()

	unlock, err := lock(ctx, filepath.Join(dir, ".xenvm.lock"), o.lockTimeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xenvm:", err)
		return exitUsage
	}
	defer unlock()

	for i := range o.steps {
		st := &o.steps[i]
		if st.script == "" {
			// Sourced in the step's subshell: the same shell as typing it.
			name := fmt.Sprintf("%d-cmd.sh", i+1)
			if err := writeFile(filepath.Join(share, "run", name), []byte(st.cmd+"\n")); err != nil {
				fmt.Fprintln(os.Stderr, "xenvm:", err)
				return exitUsage
			}
			st.typed = ". /host/run/" + name
			continue
		}
		name := fmt.Sprintf("%d-%s", i+1, filepath.Base(st.script))
		if err := copyFile(st.script, filepath.Join(share, "run", name)); err != nil {
			fmt.Fprintln(os.Stderr, "xenvm:", err)
			return exitUsage
		}
		st.cmd = "sh /host/run/" + name
		st.typed = st.cmd
	}
	if o.outDir != "" {
		if err := os.MkdirAll(o.outDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "xenvm:", err)
			return exitUsage
		}
	}
	var results *os.File
	if o.results != "" {
		if results, err = os.Create(o.results); err != nil {
			fmt.Fprintln(os.Stderr, "xenvm:", err)
			return exitUsage
		}
		defer results.Close()
		fmt.Fprintf(results, "# n\trc\tseconds\tcommand (n = boot: QEMU start to the dom0 shell)\n")
	}
	logPath := o.logPath
	if logPath == "" {
		logPath = filepath.Join(dir, "logs", "console-"+time.Now().Format("20060102-150405")+".log")
		latest := filepath.Join(dir, "logs", "console-latest.log")
		_ = os.MkdirAll(filepath.Dir(logPath), 0o755)
		_ = os.Remove(latest)
		_ = os.Symlink(filepath.Base(logPath), latest)
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xenvm:", err)
		return exitUsage
	}
	defer logFile.Close()

	// spec-ctrl=eager-fpu: Xen saves and restores FPU/SSE state at every
	// context switch instead of lazily on a #NM trap after setting CR0.TS.
	// With the lazy default (Xen's choice for AMD CPUs) processes in dom0
	// and in the guests took general-protection faults under sustained
	// trapped MMIO on this TCG-emulated SVM (the README's "vGPU guests under
	// TCG"); with it, an fv-optimized madd run of 33,029 trapped accesses
	// verified with no fault. A later -xen-args spec-ctrl=eager-fpu=0 turns
	// it off.
	xenCmd := strings.TrimSpace(fmt.Sprintf("console=com1 com1=115200,8n1 dom0_mem=%s,max:%s loglvl=all guest_loglvl=all noreboot spec-ctrl=eager-fpu %s",
		o.dom0Mem, o.dom0Mem, o.xenArgs))
	dom0Cmd := strings.TrimSpace("console=hvc0 earlyprintk=xen quiet loglevel=4 " + o.dom0Args)
	args := []string{
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-accel", o.accel, "-cpu", o.cpu,
		"-smp", strconv.Itoa(o.smp), "-m", strconv.Itoa(o.memMB),
		"-display", "none", "-serial", "stdio",
		"-kernel", xen, "-append", xenCmd,
		"-initrd", qemuEscape(vmlinux+" "+dom0Cmd) + "," + qemuEscape(initrd),
		"-virtfs", "local,path=" + qemuEscape(share) + ",mount_tag=host,security_model=none,id=host",
	}
	args = append(args, o.qemuArgs...)

	deadline := time.Now().Add(o.timeout)
	v, err := start(o.qemu, args, logFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xenvm:", err)
		return exitUsage
	}
	vmRef.Lock()
	vmRef.vm = v
	vmRef.Unlock()
	say("QEMU pid %d; console log %s", v.cmd.Process.Pid, logPath)
	code := v.session(ctx, o, deadline, results, interactive)
	select {
	case <-interrupted:
		code = exitInterrupted
	default:
	}
	v.shutdown(o.shutdownTimeout, code == 0 || code == exitFailed)
	return code
}

// lock takes an exclusive lock on path, waiting up to timeout: one QEMU per
// test bed (they share the 9p directory, and this machine has two cores).
func lock(ctx context.Context, path string, timeout time.Duration) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	end := time.Now().Add(timeout)
	for waited := false; ; waited = true {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !waited {
			holder, _ := os.ReadFile(path)
			say("another xenvm (pid %s) is using this test bed; waiting up to %v", strings.TrimSpace(string(holder)), timeout)
		}
		if time.Now().After(end) {
			f.Close()
			return nil, fmt.Errorf("%s is still locked after %v", path, timeout)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFile(dst, data)
}

// writeFile writes data to dst (on the share), making its directory.
func writeFile(dst string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

// vm is a running QEMU and its console.
type vm struct {
	cmd    *exec.Cmd
	con    *console
	start  time.Time
	exited chan struct{} // closed once QEMU has exited and its output is read
	status error         // QEMU's exit status, valid after exited
	token  string        // makes the command markers unique to this run
}

func start(qemu string, args []string, logFile *os.File) (*vm, error) {
	cmd := exec.Command(qemu, args...)
	// Own process group: a terminal's Ctrl-C reaches xenvm, which shuts
	// QEMU down cleanly; Pdeathsig: QEMU dies with xenvm whatever happens.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	var tok [4]byte
	_, _ = rand.Read(tok[:])
	v := &vm{cmd: cmd, exited: make(chan struct{}), token: hex.EncodeToString(tok[:])}
	v.start = time.Now()
	v.con = newConsole(stdin, newLogWriter(logFile, v.start))
	v.con.log.note("# " + shellQuote(append([]string{qemu}, args...)))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", qemu, err)
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := stdout.Read(buf)
			if n > 0 {
				v.con.feed(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			v.con.qemuMessage(sc.Text())
		}
	}()
	go func() {
		readers.Wait()
		v.status = cmd.Wait()
		v.con.close()
		close(v.exited)
	}()
	return v, nil
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$;&|<>*?()[]{}`!#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

var (
	promptRE = regexp.MustCompile(`dom0# `)
	// Ends of the world worth stopping the wait for.
	deathRE = regexp.MustCompile(`Kernel panic - not syncing[^\n]*|\(XEN\) Panic on CPU \d+:|\(XEN\) Hardware Dom0 crashed`)
	haltRE  = regexp.MustCompile(`\(XEN\) Hardware Dom0 (halted|shutdown)[^\n]*|reboot: Power down`)
)

// session boots to the dom0 shell and runs the steps; it returns the exit
// status for the run.
func (v *vm) session(ctx context.Context, o *options, deadline time.Time, results io.Writer, interactive chan struct{}) int {
	bootCtx, cancel := context.WithDeadline(ctx, minTime(deadline, v.start.Add(o.bootTimeout)))
	defer cancel()
	loc, which, err := v.con.waitAny(bootCtx, 0, promptRE, deathRE)
	if err != nil || which != 0 {
		switch {
		case err == nil:
			// Let the rest of the panic reach the log.
			time.Sleep(2 * time.Second)
			err = fmt.Errorf("%s", v.con.slice(loc[0], loc[1]))
		case errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("no dom0 prompt within %v", time.Since(v.start).Round(time.Second))
		case errors.Is(err, context.Canceled):
			err = errors.New("interrupted")
		}
		v.bootFailure(err, o)
		return exitBoot
	}
	boot := time.Since(v.start)
	say("dom0 shell after %.1fs (QEMU start to the dom0 prompt)%s", boot.Seconds(), v.dom0Uptime())
	if results != nil {
		fmt.Fprintf(results, "boot\t0\t%.1f\tdom0 shell\n", boot.Seconds())
	}

	// No echo, no prompts: what comes back between a command and its
	// marker is the command's output.
	if err := v.sync(ctx, "stty -echo; PS1= PS2=", 30*time.Second); err != nil {
		say("the dom0 shell does not answer: %v", err)
		v.showTail(20)
		return exitConsoleLost
	}

	code := 0
	for i, s := range o.steps {
		n := i + 1
		if time.Now().After(deadline) {
			say("the run's time limit (-timeout %v) is up; skipping %d command(s)", o.timeout, len(o.steps)-i)
			code = exitFailed
			break
		}
		limit := minTime(deadline, time.Now().Add(o.cmdTimeout))
		say("[%d] $ %s", n, s.cmd)
		t := time.Now()
		out, rc, err := v.runCmd(ctx, n, s.cmd, s.typed, limit)
		secs := time.Since(t).Seconds()
		if o.outDir != "" {
			_ = os.WriteFile(filepath.Join(o.outDir, fmt.Sprintf("%d.out", n)), []byte(out), 0o644)
		}
		if err != nil {
			rc = -1
		}
		if results != nil {
			fmt.Fprintf(results, "%d\t%d\t%.1f\t%s\n", n, rc, secs, strings.ReplaceAll(s.cmd, "\n", " "))
		}
		switch {
		case err != nil:
			say("[%d] %v after %.1fs", n, err, secs)
			if ctx.Err() != nil {
				return exitInterrupted
			}
			if rerr := v.recover(ctx); rerr != nil {
				say("the dom0 shell does not answer after ^C: %v", rerr)
				v.showTail(20)
				return exitConsoleLost
			}
			code = exitFailed
		case rc != 0:
			say("[%d] FAILED: exit status %d after %.1fs", n, rc, secs)
			code = exitFailed
		default:
			say("[%d] ok in %.1fs", n, secs)
		}
		if code != 0 && !o.keepGoing {
			if n < len(o.steps) {
				say("skipping %d more command(s) (-keep-going runs them)", len(o.steps)-n)
			}
			break
		}
	}
	if o.keep {
		close(interactive)
		v.interact(ctx)
	}
	return code
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// dom0Uptime reports what dom0's init printed about itself, if it did.
func (v *vm) dom0Uptime() string {
	m := regexp.MustCompile(`testbed: T\+([0-9.]+)s dom0 ready`).FindStringSubmatch(v.con.text())
	if m == nil {
		return ""
	}
	return fmt.Sprintf("; dom0 kernel up %ss", m[1])
}

func (v *vm) bootFailure(err error, o *options) {
	say("dom0 did not come up: %v (%.1fs after QEMU start)", err, time.Since(v.start).Seconds())
	v.showTail(30)
	if strings.Contains(v.con.text(), "create_bounce_frame") {
		say("hint: dom0 page-faulted in create_bounce_frame; the QEMU CPU model needs -smap,-smep (have -cpu %s)", o.cpu)
	}
}

func (v *vm) showTail(n int) {
	fmt.Printf("----- last %d console lines (all in %s) -----\n", n, v.con.log.f.Name())
	fmt.Println(v.con.tail(n))
	if q := v.con.qemuText(); q != "" {
		fmt.Printf("----- QEMU said -----\n%s\n", q)
	}
	fmt.Println("-----")
}

func (v *vm) marker(id string) (send string, re *regexp.Regexp) {
	// The quotes keep the echoed command (if echo were on) from matching.
	return fmt.Sprintf(`echo "@@XV""%s-%s rc=$?"`, v.token, id),
		regexp.MustCompile(fmt.Sprintf(`@@XV%s-%s rc=(\d+)\n`, v.token, regexp.QuoteMeta(id)))
}

// sync runs a command with no interesting output and waits for its marker.
func (v *vm) sync(ctx context.Context, cmd string, timeout time.Duration) error {
	v.con.syncs++
	send, re := v.marker("s" + strconv.Itoa(v.con.syncs))
	from := v.con.len()
	if err := v.con.send(cmd + "; " + send + "\n"); err != nil {
		return err
	}
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, _, err := v.con.waitAny(c, from, re)
	return err
}

// recover interrupts whatever runs in the dom0 shell and checks it answers.
func (v *vm) recover(ctx context.Context) error {
	say("sending ^C to dom0")
	if err := v.con.send("\x03"); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	// Set the shell up again: if the old one exited, init started another.
	return v.sync(ctx, "stty -echo; PS1= PS2=", 30*time.Second)
}

// Lines Xen itself prints on the serial port (its own, and HVM guests' debug
// port output as "(d3) ..."), as opposed to dom0's.
var xenLineRE = regexp.MustCompile(`(?m)^\((XEN|d[0-9]+)\) [^\n]*\n`)

// runCmd types cmd in the dom0 shell (the console log shows shown, the
// step as written), printing its output as it comes; it returns the output
// (without Xen's own console lines) and exit status.
func (v *vm) runCmd(ctx context.Context, n int, shown, cmd string, deadline time.Time) (string, int, error) {
	send, re := v.marker(strconv.Itoa(n))
	from := v.con.len()
	v.con.log.note(fmt.Sprintf(">>> [%d] %s", n, shown))
	// A subshell: an exit in cmd cannot end the dom0 shell, and a trailing
	// comment or & is harmless; stdin from /dev/null, so the command cannot
	// eat the marker line.
	if err := v.con.send("( " + cmd + "\n) </dev/null; " + send + "\n"); err != nil {
		return "", 0, err
	}
	c, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	printed := from
	progress := func(upTo int) {
		// Print whole lines as they arrive. A look while the output grew
		// may have printed past where the marker is found later.
		if upTo <= printed {
			return
		}
		chunk := v.con.slice(printed, upTo)
		if i := strings.LastIndexByte(chunk, '\n'); i >= 0 {
			fmt.Print(xenLineRE.ReplaceAllString(chunk[:i+1], ""))
			printed += i + 1
		}
	}
	loc, which, err := v.con.waitProgress(c, from, progress, re, deathRE)
	if err == nil && which == 1 {
		time.Sleep(2 * time.Second) // the rest of the report, for the log
		err = fmt.Errorf("dom0 crashed: %s", v.con.slice(loc[0], loc[1]))
	}
	if err != nil {
		progress(v.con.len())
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("timed out")
		}
		return xenLineRE.ReplaceAllString(v.con.slice(from, v.con.len()), ""), 0, err
	}
	progress(loc[0])
	if printed < loc[0] {
		if rest := v.con.slice(printed, loc[0]); rest != "" {
			fmt.Println(rest) // output without a final newline
		}
	}
	rc, _ := strconv.Atoi(v.con.slice(loc[2], loc[3]))
	return xenLineRE.ReplaceAllString(v.con.slice(from, loc[0]), ""), rc, nil
}

// interact hands the console to the terminal until stdin ends or QEMU exits.
func (v *vm) interact(ctx context.Context) {
	say("the console is yours: dom0 shell; Ctrl-D (or poweroff -f) powers off, Ctrl-C goes to dom0")
	from := v.con.len()
	_ = v.con.send("stty echo; PS1='dom0# '\n")
	input := make(chan struct{})
	go func() {
		defer close(input)
		r := bufio.NewReader(os.Stdin)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				if v.con.send(line) != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// At the end of the input, what was typed still runs: wait (a minute at
	// most) for a marker sent after it.
	var eofRE *regexp.Regexp
	eofFrom := 0
	var drained <-chan time.Time
	for {
		n := v.con.len()
		if n > from {
			fmt.Print(v.con.slice(from, n))
			from = n
		}
		if eofRE != nil && eofRE.MatchString(v.con.slice(eofFrom, n)) {
			return
		}
		select {
		case <-input:
			input = nil
			send, re := v.marker("eof")
			eofRE, eofFrom = re, v.con.len()
			_ = v.con.send(send + "\n")
			drained = time.After(time.Minute)
		case <-drained:
			return
		case <-v.exited:
			fmt.Print(v.con.slice(from, v.con.len()))
			return
		case <-ctx.Done():
			return
		case <-v.con.changed():
		}
	}
}

// shutdown powers dom0 off (when it can still be asked) and makes sure QEMU
// is gone: SIGTERM after the time allowed, SIGKILL 10 s later.
func (v *vm) shutdown(timeout time.Duration, polite bool) {
	t := time.Now()
	select {
	case <-v.exited:
	default:
		if polite {
			from := v.con.len()
			_ = v.con.send("sync; poweroff -f\n")
			// Xen halts rather than powering off on some paths: then
			// QEMU keeps running and only needs telling.
			c, cancel := context.WithTimeout(context.Background(), timeout)
			_, _, err := v.con.waitAny(c, from, haltRE)
			cancel()
			if err == nil {
				select {
				case <-v.exited:
				case <-time.After(5 * time.Second):
				}
			}
		}
		v.stop()
	}
	<-v.exited
	how := "exited"
	if v.status != nil {
		how = v.status.Error()
	}
	if polite {
		how += fmt.Sprintf(" %.1fs after poweroff", time.Since(t).Seconds())
	}
	say("QEMU %s (%.1fs in all)", how, time.Since(v.start).Seconds())
	v.con.log.flush()
}

func (v *vm) stop() {
	select {
	case <-v.exited:
		return
	default:
	}
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-v.exited:
		return
	case <-time.After(10 * time.Second):
	}
	say("QEMU ignored SIGTERM; killing it")
	_ = v.cmd.Process.Kill()
}

// console is the serial port: everything QEMU printed (carriage returns
// dropped), and a paced writer for what we type.
type console struct {
	mu      sync.Mutex
	buf     []byte
	qemuMsg []string
	notify  chan struct{} // closed and replaced whenever buf grows
	closed  bool
	w       io.WriteCloser
	log     *logWriter
	syncs   int
}

func newConsole(w io.WriteCloser, log *logWriter) *console {
	return &console{w: w, log: log, notify: make(chan struct{})}
}

func (c *console) feed(p []byte) {
	c.log.write(p)
	c.mu.Lock()
	for _, b := range p {
		if b != '\r' {
			c.buf = append(c.buf, b)
		}
	}
	close(c.notify)
	c.notify = make(chan struct{})
	c.mu.Unlock()
}

func (c *console) qemuMessage(s string) {
	c.log.note("qemu: " + s)
	c.mu.Lock()
	c.qemuMsg = append(c.qemuMsg, s)
	c.mu.Unlock()
}

func (c *console) close() {
	c.mu.Lock()
	c.closed = true
	close(c.notify)
	c.notify = make(chan struct{})
	c.mu.Unlock()
}

func (c *console) changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notify
}

func (c *console) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buf)
}

func (c *console) slice(from, to int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.buf[from:to])
}

func (c *console) text() string { return c.slice(0, c.len()) }

func (c *console) qemuText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.qemuMsg, "\n")
}

func (c *console) tail(n int) string {
	lines := strings.Split(strings.TrimRight(c.text(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var errQEMUExited = errors.New("QEMU exited")

// waitAny waits until one of res matches the console from offset from on;
// it returns the match's submatch indices (absolute) and which one matched.
func (c *console) waitAny(ctx context.Context, from int, res ...*regexp.Regexp) ([]int, int, error) {
	for {
		c.mu.Lock()
		best, which := []int(nil), -1
		for i, re := range res {
			if loc := re.FindSubmatchIndex(c.buf[from:]); loc != nil && (best == nil || loc[0] < best[0]) {
				best, which = loc, i
			}
		}
		closed, ch := c.closed, c.notify
		c.mu.Unlock()
		if best != nil {
			for i := range best {
				if best[i] >= 0 {
					best[i] += from
				}
			}
			return best, which, nil
		}
		if closed {
			return nil, -1, errQEMUExited
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, -1, ctx.Err()
		}
	}
}

// waitProgress is waitAny, calling progress with the console's length
// whenever it grows.
func (c *console) waitProgress(ctx context.Context, from int, progress func(int), res ...*regexp.Regexp) ([]int, int, error) {
	for {
		c2, cancel := context.WithCancel(ctx)
		ch := c.changed()
		go func() {
			select {
			case <-ch:
				cancel()
			case <-c2.Done():
			}
		}()
		loc, which, err := c.waitAny(c2, from, res...)
		cancel()
		if err == nil {
			return loc, which, nil
		}
		if ctx.Err() != nil || errors.Is(err, errQEMUExited) {
			return nil, -1, err
		}
		progress(c.len())
	}
}

// send types s on the serial port, 32 bytes every 10 ms: Xen hands serial
// input to dom0 through a 128-byte ring and drops what does not fit.
func (c *console) send(s string) error {
	for len(s) > 0 {
		n := min(32, len(s))
		if _, err := io.WriteString(c.w, s[:n]); err != nil {
			return fmt.Errorf("console: %w", err)
		}
		s = s[n:]
		if len(s) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// logWriter timestamps the console, line by line, relative to QEMU's start.
type logWriter struct {
	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	start   time.Time
	partial bool // the last line written has no newline yet
}

func newLogWriter(f *os.File, start time.Time) *logWriter {
	return &logWriter{f: f, w: bufio.NewWriter(f), start: start}
}

func (l *logWriter) stamp() {
	fmt.Fprintf(l.w, "[%8.3f] ", time.Since(l.start).Seconds())
}

func (l *logWriter) write(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range p {
		if b == '\r' {
			continue
		}
		if !l.partial {
			l.stamp()
			l.partial = true
		}
		l.w.WriteByte(b)
		if b == '\n' {
			l.partial = false
		}
	}
	l.w.Flush()
}

// note writes a line of our own into the log.
func (l *logWriter) note(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.partial {
		l.w.WriteByte('\n')
		l.partial = false
	}
	l.stamp()
	l.w.WriteString(s + "\n")
	l.w.Flush()
}

func (l *logWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.partial {
		l.w.WriteByte('\n')
		l.partial = false
	}
	l.w.Flush()
}
