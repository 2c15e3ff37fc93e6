package config

import "testing"

func TestMetricsAddr(t *testing.T) {
	for _, tt := range []struct {
		in, network string
		ok          bool
	}{
		{"/run/gpuvm/metrics.sock", "unix", true},
		{"127.0.0.1:9464", "tcp", true},
		{"[::1]:9464", "tcp", true},
		{":9464", "tcp", true},
		{"localhost:9464", "tcp", true},
		{"9464", "", false},
		{"relative/metrics.sock", "", false},
		{"127.0.0.1:0", "", false},
		{"127.0.0.1:http", "", false},
		{"/" + string(make([]byte, 200)), "", false},
	} {
		network, _, err := MetricsAddr(tt.in)
		if (err == nil) != tt.ok || network != tt.network {
			t.Errorf("MetricsAddr(%q) = %q, %v; want ok %v network %q", tt.in, network, err, tt.ok, tt.network)
		}
	}
	_, err := Parse([]byte("[metrics]\nlisten = \"9464\"\n"), "m.toml")
	if got := problems(t, err); len(got) != 1 || got[0] != `m.toml:2:10: metrics.listen: "9464": want an absolute Unix socket path or host:port (e.g. 127.0.0.1:9464)` {
		t.Errorf("problems %q", got)
	}
}
