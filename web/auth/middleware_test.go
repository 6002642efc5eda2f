package auth

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// whoami answers with the principal in the request's context.
var whoami = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	p, ok := FromContext(r.Context())
	_, _ = fmt.Fprintf(w, "%v %s %s %s", ok, p.Name, p.Role, p.Method)
})

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareOff(t *testing.T) {
	t.Parallel()
	h := Middleware(nil, RequiredRole, whoami)
	r := httptest.NewRequest(http.MethodPost, "/nodes/n1", nil)
	w := serve(h, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "false  Role(0) ", w.Body.String())
}

func TestMiddlewareNoCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := Middleware(b.users, RequiredRole, whoami)
	w := serve(h, httptest.NewRequest(http.MethodGet, "/queues", nil))
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, []string{`Basic realm="disbatch"`}, w.Header().Values("WWW-Authenticate"))
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var body map[string]string
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	require.Contains(t, body["error"], "authentication required")
}

func TestMiddlewareBadCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := Middleware(b.users, RequiredRole, whoami)

	w := serve(h, basicRequest("alice", "wrong"))
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, []string{`Basic realm="disbatch"`}, w.Header().Values("WWW-Authenticate"))
	require.JSONEq(t, `{"error":"invalid credentials"}`, w.Body.String())

	w = serve(h, bearerRequest("dbt_nope"))
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, []string{`Bearer realm="disbatch", error="invalid_token"`, `Basic realm="disbatch"`}, w.Header().Values("WWW-Authenticate"))
	require.JSONEq(t, `{"error":"invalid credentials"}`, w.Body.String())
	require.NotContains(t, w.Body.String(), "dbt_nope")
}

func TestMiddlewareForbidden(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := Middleware(b.users, RequiredRole, whoami)

	w := serve(h, bearerRequest(b.token)) // read may GET
	require.Equal(t, http.StatusOK, w.Code)

	r := bearerRequest(b.token)
	r.Method = http.MethodPost // read may not POST
	w = serve(h, r)
	require.Equal(t, http.StatusForbidden, w.Code)
	require.Empty(t, w.Header().Values("WWW-Authenticate"))
	require.JSONEq(t, `{"error":"\"ci-bot\" has role read; this request needs role write"}`, w.Body.String())

	r = httptest.NewRequest(http.MethodPost, "/nodes/n1", nil)
	r.SetBasicAuth("bob", bobPassword) // write may not change a node
	w = serve(h, r)
	require.Equal(t, http.StatusForbidden, w.Code)
	require.Contains(t, w.Body.String(), "needs role admin")

	r = httptest.NewRequest(http.MethodPost, "/nodes/n1", nil)
	r.SetBasicAuth("carol", carolPassword) // admin may
	w = serve(h, r)
	require.Equal(t, http.StatusOK, w.Code)

	// A policy returning no role denies.
	h = Middleware(b.users, func(*http.Request) Role { return 0 }, whoami)
	w = serve(h, basicRequest("carol", carolPassword))
	require.Equal(t, http.StatusForbidden, w.Code)
}

func TestMiddlewarePutsThePrincipalInTheContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := Middleware(b.users, nil, whoami) // nil need: RequiredRole

	w := serve(h, basicRequest("bob", bobPassword))
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "true bob write basic", w.Body.String())

	w = serve(h, bearerRequest(b.token))
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "true ci-bot read bearer", w.Body.String())
}

func TestMiddlewareOnDeny(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type v1Error struct {
		Error struct {
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Field   *string `json:"field"`
		} `json:"error"`
	}
	v1 := func(w http.ResponseWriter, _ *http.Request, status int, msg string) {
		var e v1Error
		e.Error.Code = map[int]string{401: "unauthorized", 403: "forbidden"}[status]
		e.Error.Message = msg
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(e)
	}
	h := MiddlewareOnDeny(b.users, RequiredRole, v1, whoami)

	w := serve(h, httptest.NewRequest(http.MethodGet, "/api/v1/queues", nil))
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, `Basic realm="disbatch"`, w.Header().Get("WWW-Authenticate"))
	require.JSONEq(t, `{"error":{"code":"unauthorized","message":"authentication required: send HTTP Basic credentials or a bearer token","field":null}}`, w.Body.String())

	r := httptest.NewRequest(http.MethodDelete, "/api/v1/queues/q1", nil)
	r.SetBasicAuth("alice", alicePassword)
	w = serve(h, r)
	require.Equal(t, http.StatusForbidden, w.Code)
	require.JSONEq(t, `{"error":{"code":"forbidden","message":"\"alice\" has role read; this request needs role write","field":null}}`, w.Body.String())
}

func TestContext(t *testing.T) {
	t.Parallel()
	_, ok := FromContext(t.Context())
	require.False(t, ok)
	p := Principal{Name: "x", Role: RoleWrite, Method: MethodBearer}
	got, ok := FromContext(NewContext(t.Context(), p))
	require.True(t, ok)
	require.Equal(t, p, got)
}
