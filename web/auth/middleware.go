package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Realm is the realm of the WWW-Authenticate challenges: the Disbatch
// 4.103 Perl CLI answers challenges for this realm.
const Realm = "disbatch"

// OnDeny writes the response to a denied request: status is 401 (no or
// bad credentials), 403 (a role too low) or 500 (the check itself
// failed), msg a sentence for the client that holds no secret. The
// WWW-Authenticate header is already set. The 4.103 routes and the v1
// routes each pass their own, as their error bodies differ.
type OnDeny func(w http.ResponseWriter, r *http.Request, status int, msg string)

// DenyJSON is the default OnDeny: {"error":"<msg>"}, the error body of the
// Disbatch 4.103 API.
func DenyJSON(w http.ResponseWriter, _ *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// Middleware is MiddlewareOnDeny with DenyJSON.
func Middleware(users *Users, need func(*http.Request) Role, next http.Handler) http.Handler {
	return MiddlewareOnDeny(users, need, nil, next)
}

// MiddlewareOnDeny lets a request through to next when its principal's
// role allows need(r), with the principal in its context (FromContext).
//
// When users is nil authentication is off: every request goes through,
// and FromContext reports false. Otherwise a request without credentials,
// or with bad ones, gets 401 with a challenge (WWW-Authenticate: Basic
// realm="disbatch", and a Bearer challenge first when it tried a bearer
// token), and an authenticated request whose role is too low gets 403;
// onDeny (nil: DenyJSON) writes their bodies. A nil need is RequiredRole;
// if need returns an invalid Role the request is denied.
func MiddlewareOnDeny(users *Users, need func(*http.Request) Role, onDeny OnDeny, next http.Handler) http.Handler {
	if users == nil {
		return next
	}
	if need == nil {
		need = RequiredRole
	}
	if onDeny == nil {
		onDeny = DenyJSON
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := users.Authenticate(r)
		switch {
		case errors.Is(err, ErrNoCredentials):
			challenge(w, false, false)
			onDeny(w, r, http.StatusUnauthorized, "authentication required: send HTTP Basic credentials or a bearer token")
			return
		case errors.Is(err, ErrBadCredentials):
			challenge(w, triedBearer(r), true)
			onDeny(w, r, http.StatusUnauthorized, "invalid credentials")
			return
		case errors.Is(err, ErrBusy):
			w.Header().Set("Retry-After", "1")
			onDeny(w, r, http.StatusServiceUnavailable, "too many password checks at once; try again shortly")
			return
		case err != nil:
			onDeny(w, r, http.StatusInternalServerError, "could not check the credentials")
			return
		}
		if n := need(r); !p.Role.Allows(n) {
			onDeny(w, r, http.StatusForbidden, fmt.Sprintf("%q has role %s; this request needs role %s", p.Name, p.Role, n))
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), p)))
	})
}

func challenge(w http.ResponseWriter, bearer, invalid bool) {
	h := w.Header()
	if bearer {
		c := `Bearer realm="` + Realm + `"`
		if invalid {
			c += `, error="invalid_token"`
		}
		h.Add("WWW-Authenticate", c)
	}
	h.Add("WWW-Authenticate", `Basic realm="`+Realm+`"`)
}

func triedBearer(r *http.Request) bool {
	scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "Bearer")
}

type contextKey struct{}

// NewContext returns ctx carrying p, as the middleware passes it on.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, contextKey{}, p)
}

// FromContext returns the principal the middleware put in ctx; false when
// there is none (authentication off, or a request that did not go through
// the middleware).
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(contextKey{}).(Principal)
	return p, ok
}
