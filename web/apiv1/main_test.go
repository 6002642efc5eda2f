package apiv1

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

// env is a test's API over a fresh database. Every exchange through it
// is checked against the OpenAPI document the handler serves.
type env struct {
	t   *testing.T
	st  *store.Store
	db  *mongo.Database
	h   http.Handler
	chk *checker
}

// setup makes the API; mods may change its options and the store's.
func setup(t *testing.T, mods ...func(*Options, *store.Options)) *env {
	t.Parallel()
	db := mongotest.Database(t)
	var o Options
	var so store.Options
	for _, m := range mods {
		m(&o, &so)
	}
	st := store.New(db, so)
	require.NoError(t, st.IndexesEnsure(ctxT(t)))
	o.Store = st
	doc, err := Document(o)
	require.NoError(t, err)
	chk, err := newChecker(doc)
	require.NoError(t, err)
	return &env{t: t, st: st, db: db, h: New(o), chk: chk}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// response is a recorded response.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) decode(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), "body: %s", r.body)
}

func (r *response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	r.decode(t, &m)
	return m
}

// apiErr is the error of an error response.
func (r *response) apiErr(t *testing.T) errorDetail {
	t.Helper()
	var e errorBody
	r.decode(t, &e)
	return e.Error
}

// field is the error's field, "" for null.
func (d errorDetail) field() string {
	if d.Field == nil {
		return ""
	}
	return *d.Field
}

// do sends a request straight to the handler: body nil (none), a string
// or []byte (as is) or anything else (as JSON). A body gets Content-Type
// application/json unless hdr (name, value pairs) says otherwise. Safe
// from any goroutine: a response the document does not describe fails
// the test with t.Errorf.
func (e *env) do(method, target string, body any, hdr ...string) *response {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		raw, err = json.Marshal(b)
		if err != nil {
			e.t.Errorf("marshal body: %v", err)
			return &response{}
		}
	}
	req := httptest.NewRequest(method, target, bytes.NewReader(raw))
	if body == nil {
		req = httptest.NewRequest(method, target, nil)
	} else {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	reqHeader := req.Header.Clone()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	res := rec.Result()
	out, _ := io.ReadAll(res.Body)
	if err := e.chk.check(exchange{method: method, target: target, reqHeader: reqHeader, reqBody: raw, status: res.StatusCode, header: res.Header, body: out}); err != nil {
		e.t.Errorf("OpenAPI conformance: %v", err)
	}
	return &response{status: res.StatusCode, header: res.Header, body: out}
}

// want does the request and requires the status.
func (e *env) want(status int, method, target string, body any, hdr ...string) *response {
	e.t.Helper()
	r := e.do(method, target, body, hdr...)
	require.Equal(e.t, status, r.status, "%s %s: %s", method, target, r.body)
	return r
}

// wantErr does the request and requires an error with this status, code
// and field ("" for null).
func (e *env) wantErr(status int, code, field, method, target string, body any, hdr ...string) errorDetail {
	e.t.Helper()
	r := e.want(status, method, target, body, hdr...)
	d := r.apiErr(e.t)
	require.Equal(e.t, code, d.Code, "%s %s: %s", method, target, r.body)
	require.Equal(e.t, field, d.field(), "%s %s: %s", method, target, r.body)
	require.NotEmpty(e.t, d.Message)
	return d
}

// server serves the handler over real HTTP (streaming, Content-Length,
// connections); its exchanges are checked against the document when the
// test ends.
func (e *env) server() *httptest.Server {
	var mu sync.Mutex
	var seen []exchange
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqBody, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		r.Body = io.NopCloser(bytes.NewReader(reqBody))
		cw := &captureWriter{ResponseWriter: w}
		e.h.ServeHTTP(cw, r)
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, exchange{method: r.Method, target: r.URL.RequestURI(), reqHeader: r.Header.Clone(), reqBody: reqBody,
			status: cw.status, header: w.Header().Clone(), body: cw.body.Bytes()})
	}))
	e.t.Cleanup(func() {
		srv.Close() // waits for the handlers
		mu.Lock()
		defer mu.Unlock()
		for _, x := range seen {
			if err := e.chk.check(x); err != nil {
				e.t.Errorf("OpenAPI conformance: %v", err)
			}
		}
	})
	return srv
}

type captureWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *captureWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

func (c *captureWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func ptr[T any](v T) *T { return &v }
