package auth

import (
	"net/http"
	"path"
	"strings"
)

// RequiredRole is the server's default policy, for paths as the handler
// sees them (mounted under a prefix, strip it first):
//
//   - GET, HEAD and OPTIONS need read;
//   - the read-only searches of the 4.103 API, POST /tasks/search and
//     POST /search-tasks-json, need read;
//   - any other method on the nodes (/nodes, /nodes/..., /api/v1/nodes,
//     /api/v1/nodes/...) or on queue balancing (/balance, /api/v1/balance)
//     needs admin;
//   - any other method anywhere else needs write.
//
// The path is judged both as it is and cleaned, and the higher role
// wins: /queues/../nodes/x is a node, and /tasks/search// (which 4.103's
// routes match as a queue "search" and a collection "/") is not the
// read-only search.
func RequiredRole(r *http.Request) Role {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return RoleRead
	}
	p := "/" + strings.TrimPrefix(r.URL.Path, "/")
	return max(roleFor(r.Method, p), roleFor(r.Method, path.Clean(p)))
}

// roleFor is what a write with method to path p needs.
func roleFor(method, p string) Role {
	switch {
	case under(p, "/nodes"), under(p, "/api/v1/nodes"), under(p, "/balance"), under(p, "/api/v1/balance"):
		return RoleAdmin
	case method == http.MethodPost && (p == "/tasks/search" || p == "/search-tasks-json"):
		return RoleRead
	}
	return RoleWrite
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}
