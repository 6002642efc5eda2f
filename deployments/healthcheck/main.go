// Command healthcheck asks an HTTP endpoint whether it is healthy: it
// exits 0 when a GET of the URL answers 200, 1 otherwise. It exists for
// container health checks: the distroless image has no shell, curl or
// wget, so deployments/Dockerfile ships this static binary as
// /usr/local/bin/healthcheck, and docker-compose.yml runs
//
//	healthcheck http://127.0.0.1:8080/healthz
//
// in the disbatch-web container. It sends no credentials (/healthz and
// /readyz need none) and follows no redirects. For an https:// URL it does
// not verify the certificate: it probes the container's own port, where
// the certificate is made out to the service's public name, not to
// 127.0.0.1; nothing secret is sent or trusted.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// timeout bounds the whole check; the runtime's own timeout is longer.
const timeout = 3 * time.Second

func main() {
	os.Exit(check(os.Args[1:], os.Stderr))
}

func check(args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: healthcheck URL  (exit 0 when GET URL answers 200)")
		return 2
	}
	u, err := url.Parse(args[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "healthcheck: %q: want an http:// or https:// URL\n", args[0])
		return 2
	}
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy: nil, // the container's own port: never through a proxy
			// See the package comment.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // a liveness probe of its own port
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 2
	}
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		fmt.Fprintf(stderr, "healthcheck: GET %s: %v\n", u.Redacted(), err)
		return 1
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "healthcheck: GET %s: %s\n", u.Redacted(), resp.Status)
		return 1
	}
	return 0
}
