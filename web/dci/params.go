package dci

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// params are a request's parameters, read the 4.103 way (parse_params):
// from a form body when Content-Type is exactly
// application/x-www-form-urlencoded, from a JSON body when it is exactly
// application/json (with a charset it is not, and the query string is read
// instead), else from the query string; for GET too. Keys starting with "."
// are options.
type params struct {
	// body is the decoded JSON body when it was not an object (an array,
	// for POST /tasks), else nil.
	body    any
	fields  map[string]any
	options map[string]any
	// keys are fields' keys in the order given (for "first invalid key").
	keys []string
	// bad is set when the body could not be read as its type says.
	bad error
}

// errBody is a body that is not what its Content-Type says.
var errBody = errors.New("the body is not valid JSON")

func readParams(r *http.Request) params {
	p := params{fields: map[string]any{}, options: map[string]any{}}
	ct := r.Header.Get("Content-Type")
	switch ct {
	case "application/x-www-form-urlencoded":
		b, err := io.ReadAll(r.Body)
		if err != nil {
			p.bad = err
			return p
		}
		q, err := url.ParseQuery(string(b))
		if err != nil {
			p.bad = err
			return p
		}
		p.addQuery(string(b), q)
	case "application/json":
		b, err := io.ReadAll(r.Body)
		if err != nil {
			p.bad = err
			return p
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return p
		}
		v, err := decodeJSON(b)
		if err != nil {
			p.bad = errBody
			return p
		}
		m, ok := v.(map[string]any)
		if !ok {
			p.body = v
			return p
		}
		for _, k := range objectKeys(b) {
			if _, seen := m[k]; seen {
				p.set(k, m[k])
			}
		}
	default:
		p.addQuery(r.URL.RawQuery, r.URL.Query())
	}
	return p
}

// addQuery adds a query string's keys, in their order: one value as a
// string, repeated keys as an array.
func (p *params) addQuery(raw string, q url.Values) {
	seen := map[string]bool{}
	for _, part := range strings.FieldsFunc(raw, func(r rune) bool { return r == '&' || r == ';' }) {
		k, _, _ := strings.Cut(part, "=")
		k, err := url.QueryUnescape(k)
		if err != nil || seen[k] {
			continue
		}
		seen[k] = true
		vals := q[k]
		if len(vals) == 1 {
			p.set(k, vals[0])
			continue
		}
		a := make([]any, len(vals))
		for i, v := range vals {
			a[i] = v
		}
		p.set(k, a)
	}
}

func (p *params) set(k string, v any) {
	if strings.HasPrefix(k, ".") {
		p.options[k[1:]] = v
		return
	}
	if _, ok := p.fields[k]; !ok {
		p.keys = append(p.keys, k)
	}
	p.fields[k] = v
}

// decodeJSON decodes with numbers kept as their text.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errBody
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errBody
	}
	return v, nil
}

// objectKeys returns the keys of the top-level object in b, in order.
func objectKeys(b []byte) []string {
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var keys []string
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return keys
		}
		k, _ := t.(string)
		keys = append(keys, k)
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}

// truthy is Perl's truth of an option's value.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != "" && x != "0"
	case json.Number:
		f, err := x.Float64()
		return err != nil || f != 0
	case int:
		return x != 0
	case int64:
		return x != 0
	case float64:
		return x != 0
	}
	return true
}

// scalar returns a parameter that must be a plain value as its text.
func scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case bool:
		if x {
			return "1", true
		}
		return "", true
	case nil:
		return "", false
	}
	return "", false
}
