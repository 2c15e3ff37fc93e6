package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// controlGet fetches path from the control API on socket and decodes its
// JSON answer into out.
func controlGet(ctx context.Context, socket, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://aggregator"+path, nil)
	if err != nil {
		return err
	}
	resp, err := controlClient(socket).Do(req)
	if err != nil {
		return noDaemonHint(fmt.Errorf("control API: %w", err), "gpuvm serve", "--control-socket")
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("control API %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("control API %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("control API %s: %w", path, err)
	}
	return nil
}
