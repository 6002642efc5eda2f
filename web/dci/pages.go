package dci

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// WantHTML is 4.103's want_json turned round: JSON unless the Accept
// header rates text/html at least as high as application/json (no Accept
// header, as from curl or the CLI, is JSON).
func WantHTML(r *http.Request) bool {
	q := map[string]float64{}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		fields := strings.Split(strings.TrimSpace(part), ";")
		typ := strings.ToLower(strings.TrimSpace(fields[0]))
		if typ == "" {
			continue
		}
		weight := 1.0
		for _, f := range fields[1:] {
			if k, v, ok := strings.Cut(strings.TrimSpace(f), "="); ok && strings.TrimSpace(k) == "q" {
				if w, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					weight = w
				}
			}
		}
		q[typ] = weight
	}
	jsonQ, ok := q["application/json"]
	if !ok {
		jsonQ = 1
	}
	return q["text/html"] >= jsonQ && q["text/html"] > 0
}

var page = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Disbatch</title>
<style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em;overflow:auto}</style>
</head><body>
<p><a href="/">queues</a> · <a href="/tasks">tasks</a> · <a href="/balance">balance</a> · <a href="/monitoring">monitoring</a> · <a href="/api/v1/openapi.json">v1 API</a></p>
{{if .H1}}<h1> {{.H1}} </h1>{{end}}{{if .H2}}<h2>{{.H2}}</h2>{{end}}
{{if .Form}}<form method="get" action="/tasks">{{range .Form}}<label>{{.}} <input name="{{.}}"></label> {{end}}<label>.limit <input name=".limit" value="20"></label> <input type="submit" value="Search"></form>{{end}}
{{if .Count}}<div id="results">Results returned: {{.Count}}<br />{{end}}
{{range .Blocks}}<pre>{{.}}</pre>
{{end}}{{if .Count}}</div>{{end}}
</body></html>
`))

type pageData struct {
	H1, H2 string
	Form   []string
	Count  string
	Blocks []template.HTML
}

// textHTML escapes text for a <pre>: only &, < and >, so that JSON's quotes
// stay readable (and greppable) in the page source.
func textHTML(s string) template.HTML {
	return template.HTML(strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s))
}

// htmlPage renders an answer for a browser: 4.103's headings (its own
// test looks for them) over the JSON, pretty.
func htmlPage(w http.ResponseWriter, status int, d pageData) {
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(status)
	_ = page.Execute(w, d)
}

//go:embed static
var embedded embed.FS

// assets are the queue browser's page and scripts, served when no web
// root is given (or it lacks the file).
var assets, _ = fs.Sub(embedded, "static")

// GET /: the queue browser page, 4.103's own from the web root when one
// is given, else this server's.
func (h *Handler) index(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	if h.o.WebRoot != "" {
		if _, err := os.Stat(filepath.Join(h.o.WebRoot, "index.html")); err == nil {
			http.ServeFile(w, r, filepath.Join(h.o.WebRoot, "index.html"))
			return
		}
	}
	serveAsset(w, r, "index.html")
}

// static serves files of the web root, then the embedded ones, and 404
// for the rest.
func (h *Handler) static(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	clean := path.Clean("/" + r.URL.Path)
	if h.o.WebRoot != "" {
		name := filepath.Join(h.o.WebRoot, filepath.FromSlash(clean))
		if f, err := os.Open(name); err == nil {
			defer f.Close()
			if st, err := f.Stat(); err == nil && !st.IsDir() {
				if ct, ok := staticTypes[filepath.Ext(name)]; ok {
					w.Header().Set("Content-Type", ct)
				}
				// ServeContent, not ServeFile: that one redirects
				// /index.html to /, where 4.103 serves the file.
				http.ServeContent(w, r, name, st.ModTime(), f)
				return
			}
		}
	}
	if st, err := fs.Stat(assets, strings.TrimPrefix(clean, "/")); err == nil && !st.IsDir() {
		serveAsset(w, r, strings.TrimPrefix(clean, "/"))
		return
	}
	notFound(w)
}

func serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	b, err := fs.ReadFile(assets, name)
	if err != nil {
		notFound(w)
		return
	}
	ct, ok := staticTypes[path.Ext(name)]
	if !ok {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

// staticTypes are the Content-Types 4.103's static files go out with
// where Go's would differ.
var staticTypes = map[string]string{".js": "application/javascript", ".css": "text/css", ".html": "text/html"}
