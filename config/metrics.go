package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MetricsConfig is the [metrics] table: the Prometheus endpoint.
type MetricsConfig struct {
	// Listen is where the endpoint listens: "" (off, the default), an
	// absolute path (a Unix socket, created as the daemon's others are),
	// or a TCP "host:port" ("127.0.0.1:9464", "[::1]:9464", ":9464" for
	// every address).
	Listen string `toml:"listen"`
}

// MetricsAddr splits a metrics listen address into the network and address
// net.Listen takes ("unix" or "tcp"), or reports why it is not one.
func MetricsAddr(listen string) (network, addr string, err error) {
	if strings.HasPrefix(listen, "/") {
		if len(listen) > maxSocketPath {
			return "", "", fmt.Errorf("%d bytes long; a Unix socket path has at most %d", len(listen), maxSocketPath)
		}
		return "unix", listen, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", "", fmt.Errorf("%q: want an absolute Unix socket path or host:port (e.g. 127.0.0.1:9464)", listen)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("%q: port %q: want 1..65535", listen, port)
	}
	if host != "" && net.ParseIP(host) == nil && strings.ContainsAny(host, " /") {
		return "", "", fmt.Errorf("%q: host %q is not an address or a name", listen, host)
	}
	return "tcp", listen, nil
}

func (c Config) validateMetrics(v *validator) {
	if l := c.Metrics.Listen; v.ok("metrics.listen") && l != "" {
		if _, _, err := MetricsAddr(l); err != nil {
			v.errorf([]string{"metrics.listen"}, "%v", err)
		}
	}
}
