package aggregator

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
)

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// jsonKeys calls f with every object key in v (decoded JSON), with its path.
func jsonKeys(v any, path string, f func(path, key string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			f(path, k)
			jsonKeys(x, path+"."+k, f)
		}
	case []any:
		for i, x := range v {
			jsonKeys(x, path+"["+strconv.Itoa(i)+"]", f)
		}
	}
}

// TestControlAPISnakeCase: every answer of the control API names its
// fields in one style, snake_case, as `vgpu list` always did (`vgpu
// layout` used Go's CamelCase field names).
func TestControlAPISnakeCase(t *testing.T) {
	agg, _ := newTestAggregator(t, 2)
	g := startGuest(t, agg, "vm1", "fv-naive")
	srv := httptest.NewServer(agg.ControlHandler())
	defer srv.Close()
	id := strconv.Itoa(g.v.ID)
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/v1/vgpus"},
		{http.MethodGet, "/v1/vgpus/" + id},
		{http.MethodGet, "/v1/layout"},
		{http.MethodGet, "/v1/vgpus/99"},
		{http.MethodDelete, "/v1/vgpus/" + id},
	} {
		r, err := http.NewRequest(req.method, srv.URL+req.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var body any
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: %v", req.method, req.path, err)
		}
		n := 0
		jsonKeys(body, "", func(path, key string) {
			n++
			if !snakeCase.MatchString(key) {
				t.Errorf("%s %s: key %q at %q is not snake_case", req.method, req.path, key, path)
			}
		})
		if n == 0 {
			t.Errorf("%s %s: no keys in %v", req.method, req.path, body)
		}
	}
}
