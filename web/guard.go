package web

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/disbatch-go/disbatch/web/apiv1"
)

// Loopback reports whether addr (host:port) names this machine's loopback
// only: localhost, 127.0.0.0/8 or ::1.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return loopbackHost(host)
}

func loopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return ip != nil && ip.IsLoopback()
}

// guard answers, before any route, the requests no route may see:
//
//   - with localOnly, a Host that does not name the loopback (a server
//     without authentication on 127.0.0.1: a web page whose name an
//     attacker points at 127.0.0.1, DNS rebinding, would otherwise read
//     and write it as its own origin);
//   - a path with a "." or ".." segment once decoded ("/nodes/..%2Fx"):
//     the roles judge a cleaned path, 4.103's routes match the raw one,
//     and the two would name different routes;
//   - a state-changing request a browser sent for another site's page
//     (cross-site request forgery: the browser holds the operator's
//     credentials, and 4.103's routes take form bodies and query strings),
//     judged by Sec-Fetch-Site and Origin (http.CrossOriginProtection);
//     programs that send neither header, such as the CLIs, are not
//     affected.
//
// It also forbids framing every answer (the dashboard sets a stricter
// policy of its own) and content sniffing.
func guard(localOnly bool, trusted []string, log *slog.Logger, next http.Handler) http.Handler {
	deny := func(w http.ResponseWriter, r *http.Request, code int, kind, msg string) {
		r.Pattern = refused // for the request metrics
		if strings.HasPrefix(r.URL.Path, "/api/v1/") || slices.Contains(apiv1.SchedulerPaths, r.URL.Path) {
			apiv1.WriteError(w, code, kind, msg, "")
			return
		}
		body, _ := json.Marshal(map[string]string{"error": msg})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write(body)
	}
	cop := http.NewCrossOriginProtection()
	for _, o := range trusted {
		if err := cop.AddTrustedOrigin(o); err != nil {
			log.Error("a trusted origin is not an origin; ignored", "origin", o, "error", err)
		}
	}
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deny(w, r, http.StatusForbidden, apiv1.CodeForbidden, "a cross-origin "+r.Method+" is refused (a web page of another site asked this browser to send it;"+
			" behind a proxy that passes another Host, give disbatch-web --trusted-origin with the address browsers use)")
	}))
	protected := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		if localOnly && r.Host != "" && !loopbackHost(hostOnly(r.Host)) {
			deny(w, r, http.StatusForbidden, apiv1.CodeForbidden, "this server has no authentication and answers only requests to localhost, 127.0.0.1 or [::1], not to "+r.Host+
				" (behind a proxy that passes its own Host, give disbatch-web --users, or --insecure)")
			return
		}
		if dotSegment(r.URL.Path) {
			deny(w, r, http.StatusNotFound, apiv1.CodeNotFound, "no route has a path with . or .. segments")
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// CheckOrigin reports whether o is an origin TrustedOrigins accepts:
// scheme://host[:port], nothing more.
func CheckOrigin(o string) error {
	return http.NewCrossOriginProtection().AddTrustedOrigin(o)
}

// refused is the route the request metrics give what the guard refused.
const refused = "refused"

// hostOnly is a Host header without its port.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// dotSegment reports whether the decoded path p has a "." or ".."
// segment.
func dotSegment(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}
