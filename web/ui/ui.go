package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/disbatch-go/disbatch/web/auth"
)

//go:embed static
var embedded embed.FS

var assets, _ = fs.Sub(embedded, "static")

var shell = template.Must(template.ParseFS(assets, "index.html"))

// assetTime is what the assets' Last-Modified says: the start of the
// process, as the files are part of the binary.
var assetTime = time.Now()

// Options configure the dashboard.
type Options struct {
	// JaegerURL, when set, links each task to its trace there
	// (disbatch-web --jaeger-url).
	JaegerURL string
	// Auth says authentication is on: the page then shows the user and
	// the actions of their role only.
	Auth bool
}

// Handler serves the dashboard's page and assets.
type Handler struct{ o Options }

// New returns the dashboard's handler. Mount it at GET / (exactly), GET
// /ui/ and, for browsers, GET /balance.
func New(o Options) *Handler { return &Handler{o: o} }

// config is what the page is told, as JSON in a data attribute.
type config struct {
	User   string `json:"user,omitempty"`
	Role   string `json:"role"`
	Auth   bool   `json:"auth"`
	Jaeger string `json:"jaeger,omitempty"`
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if name, ok := strings.CutPrefix(path.Clean(r.URL.Path), "/ui/assets/"); ok {
		h.asset(w, r, name)
		return
	}
	c := config{Role: auth.RoleAdmin.String(), Auth: h.o.Auth, Jaeger: h.o.JaegerURL}
	if p, ok := auth.FromContext(r.Context()); ok {
		c.User, c.Role = p.Name, p.Role.String()
	}
	js, _ := json.Marshal(c)
	var b bytes.Buffer
	// 4.103's balance page says QueueBalancer in an h2 (its own web test
	// looks for it); the script draws the editor over it.
	data := struct {
		Config  string
		Balance bool
	}{string(js), path.Clean(r.URL.Path) == "/balance"}
	if err := shell.Execute(&b, data); err != nil {
		http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	_, _ = w.Write(b.Bytes())
}

func (h *Handler) asset(w http.ResponseWriter, r *http.Request, name string) {
	b, err := fs.ReadFile(assets, name)
	if err != nil || name == "index.html" {
		http.NotFound(w, r)
		return
	}
	switch path.Ext(name) {
	case ".js":
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case ".css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	case ".svg":
		w.Header().Set("Content-Type", "image/svg+xml")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Asked again each time (a 304 while it has not changed): cached by
	// the browser's own reckoning, an app.js from before an upgrade was
	// used for up to a tenth of the old server's uptime, against the new
	// API.
	sum := sha256.Sum256(b)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:16])+`"`)
	http.ServeContent(w, r, name, assetTime, bytes.NewReader(b))
}
