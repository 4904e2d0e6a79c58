package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// procSocket is one TCP socket of a process, with the raw fields of /proc/net/tcp:
// addresses as "0100007F:1F90", the state in hex (01 ESTABLISHED, 0A LISTEN, …).
type procSocket struct{ local, remote, state string }

// procSockets lists the process's TCP sockets, IPv4 and IPv6.
func procSockets(pid int) ([]procSocket, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	var out []procSocket
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 10 && inodes[fields[9]] {
				out = append(out, procSocket{local: fields[1], remote: fields[2], state: fields[3]})
			}
		}
		f.Close()
	}
	return out, nil
}

// procAddr turns /proc/net/tcp's "0100007F:1F90" into "127.0.0.1:8080".
func procAddr(s string) string {
	hexIP, hexPort, _ := strings.Cut(s, ":")
	var port int
	fmt.Sscanf(hexPort, "%X", &port)
	var b []byte
	for i := 0; i+8 <= len(hexIP); i += 8 {
		var w uint32
		fmt.Sscanf(hexIP[i:i+8], "%X", &w)
		// Each 32-bit word is in host (little-endian) order.
		b = append(b, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	ip := net.IP(b)
	if len(b) == 16 {
		return fmt.Sprintf("[%s]:%d", ip, port)
	}
	return fmt.Sprintf("%s:%d", ip, port)
}
