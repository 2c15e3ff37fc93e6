package ipc

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// CreateMemfd creates a memfd of size bytes suitable as guest RAM for Dial:
// created with MFD_ALLOW_SEALING and MFD_CLOEXEC, sized, and sealed with
// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL so that neither side can change
// its size after the other mapped it.
func CreateMemfd(name string, size uint64) (*os.File, error) {
	return createSealedMemfd(name, size, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
}

func createSealedMemfd(name string, size uint64, seals int) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("ipc: memfd_create %q: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("ipc: memfd %q: ftruncate %d: %w", name, size, err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			f.Close()
			return nil, fmt.Errorf("ipc: memfd %q: F_ADD_SEALS %#x: %w", name, seals, err)
		}
	}
	return f, nil
}

// CheckMemfd verifies that fd is a read-write memfd of at least minSize bytes
// whose seals include F_SEAL_SHRINK and exclude F_SEAL_WRITE and
// F_SEAL_FUTURE_WRITE (the mapping must be writable). It returns the size.
//
// F_SEAL_SHRINK matters because the other side maps the file: if its owner
// could truncate it afterwards, every access to the vanished pages would
// deliver SIGBUS to the mapping process (the aggregator, for guest RAM).
// Other shared-memory protocols (pvdrm's local transport) use it for the
// same reason.
func CheckMemfd(fd int, what string, minSize uint64) (uint64, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return 0, fmt.Errorf("%s fd is not a memfd (F_GET_SEALS: %w)", what, err)
	}
	if link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err == nil && !strings.HasPrefix(link, "/memfd:") {
		return 0, fmt.Errorf("%s fd is not a memfd (it is %q)", what, link)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return 0, fmt.Errorf("%s memfd is not sealed with F_SEAL_SHRINK (seals %#x)", what, seals)
	}
	if seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
		return 0, fmt.Errorf("%s memfd is sealed against writing (seals %#x)", what, seals)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return 0, fmt.Errorf("%s fd: F_GETFL: %w", what, err)
	}
	if fl&unix.O_ACCMODE != unix.O_RDWR {
		return 0, fmt.Errorf("%s fd is not open read-write", what)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("%s fd: fstat: %w", what, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("%s fd is not a regular file", what)
	}
	if st.Size < 0 || uint64(st.Size) < minSize {
		return 0, fmt.Errorf("%s memfd is %d bytes, need at least %d", what, st.Size, minSize)
	}
	return uint64(st.Size), nil
}
