package dci

import (
	"html/template"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// wantHTML is 4.103's want_json turned round: JSON unless the Accept
// header rates text/html at least as high as application/json (no Accept
// header, as from curl or the CLI, is JSON).
func wantHTML(r *http.Request) bool {
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

// GET /: the queue browser page of 4.103 lives in its web root
// (index.html); without one, a page of links.
func (h *Handler) index(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	if h.o.WebRoot != "" {
		if _, err := os.Stat(filepath.Join(h.o.WebRoot, "index.html")); err == nil {
			http.ServeFile(w, r, filepath.Join(h.o.WebRoot, "index.html"))
			return
		}
	}
	htmlPage(w, http.StatusOK, pageData{H1: "Disbatch"})
}

// static serves files of the web root, and 404 for the rest.
func (h *Handler) static(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	if h.o.WebRoot == "" {
		notFound(w)
		return
	}
	name := filepath.Join(h.o.WebRoot, filepath.FromSlash(filepath.Clean("/"+r.URL.Path)))
	st, err := os.Stat(name)
	if err != nil || st.IsDir() {
		notFound(w)
		return
	}
	if ct, ok := staticTypes[filepath.Ext(name)]; ok {
		w.Header().Set("Content-Type", ct)
	}
	http.ServeFile(w, r, name)
}

// staticTypes are the Content-Types 4.103's static files go out with
// where Go's would differ.
var staticTypes = map[string]string{".js": "application/javascript", ".css": "text/css", ".html": "text/html"}
