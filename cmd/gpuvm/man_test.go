package main

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuvm/gpuvm/config"
)

// TestMan: `gpuvm man` prints the manual page as roff, generated from the
// commands themselves: the title, NAME, every visible command and the
// FILES packaging installs, and not itself (it is hidden).
func TestMan(t *testing.T) {
	out, stderr, err := runApp(t, "man")
	if err != nil {
		t.Fatalf("gpuvm man: %v\n%s", err, stderr)
	}
	if !strings.HasPrefix(out, ".nh\n.TH GPUVM 1 ") {
		t.Errorf("no roff title line for section 1:\n%.200s", out)
	}
	for _, want := range []string{
		".SH NAME\ngpuvm \\- ", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH COMMANDS",
		".SH bench", ".SH serve", ".SH devmodel", ".SH vgpu", ".SS list", ".SS layout", ".SH xl", ".SH guest",
		".SH EXIT STATUS", ".SH FILES", ".I /etc/gpuvm/gpuvm.toml",
		`\fB--config, -c\fP`, `"/run/gpuvm/control.sock"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("man page lacks %q", want)
		}
	}
	if regexp.MustCompile(`(?m)^\.S[HS] man\b`).MatchString(out) {
		t.Error("the hidden man command is in its own page")
	}
	// Only root's socket directory appears, whoever generated the page.
	if d := config.DefaultSocketDir(); d != systemSocketDir && strings.Contains(out, `"`+d+"/") {
		t.Errorf("this user's socket directory %s leaked into the page", d)
	}

	out, _, err = runApp(t, "man", "--section", "8")
	if err != nil || !strings.HasPrefix(out, ".nh\n.TH GPUVM 8 ") {
		t.Errorf("--section 8: %v\n%.100s", err, out)
	}
	var ee *exitError
	if _, _, err := runApp(t, "man", "--section", "0"); !errors.As(err, &ee) || ee.code != exitUsage {
		t.Errorf("--section 0: %v, want a usage error", err)
	}
}
