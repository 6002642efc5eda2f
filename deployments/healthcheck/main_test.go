package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestCheck(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("GET /moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/healthz", http.StatusFound) })
	plain := httptest.NewServer(mux)
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()
	closed := httptest.NewServer(mux)
	closed.Close()

	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{plain.URL + "/healthz"}, 0},
		{[]string{tlsSrv.URL + "/healthz"}, 0}, // a certificate not made out to 127.0.0.1
		{[]string{plain.URL + "/readyz"}, 1},
		{[]string{plain.URL + "/moved"}, 1}, // redirects are not followed
		{[]string{plain.URL + "/nothing"}, 1},
		{[]string{closed.URL + "/healthz"}, 1},
		{nil, 2},
		{[]string{"a", "b"}, 2},
		{[]string{"127.0.0.1:8080/healthz"}, 2},
		{[]string{"ftp://127.0.0.1/healthz"}, 2},
	} {
		var stderr bytes.Buffer
		if got := check(tc.args, &stderr); got != tc.want {
			t.Errorf("check(%q) = %d, want %d; stderr: %s", tc.args, got, tc.want, stderr.String())
		}
		if tc.want == 0 && stderr.Len() > 0 {
			t.Errorf("check(%q) succeeded but wrote %q", tc.args, stderr.String())
		}
	}
}
