package apiv1

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// checker holds an OpenAPI document and checks exchanges against it, the
// way a contract fuzzer (schemathesis) does:
//
//   - the route, method and status are declared, and the response's
//     Content-Type is one the response declares;
//   - a JSON body validates against the declared schema (JSON Schema
//     2020-12, formats asserted), declared required headers are present;
//   - a 2xx answered a request the document calls valid (body, query and
//     path parameters), and a 400 about the input answered one it calls
//     invalid: the document describes exactly what the server accepts;
//   - a request no route matches is a 404, or a 405 with Allow, in the
//     error shape.
type checker struct {
	doc      map[string]any
	compiler *jsonschema.Compiler
	mux      *http.ServeMux

	mu      sync.Mutex
	schemas map[string]*jsonschema.Schema
}

const docURL = "https://disbatch.invalid/openapi.json"

func newChecker(raw []byte) (*checker, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := &checker{doc: doc.(map[string]any), compiler: jsonschema.NewCompiler(), mux: http.NewServeMux(), schemas: map[string]*jsonschema.Schema{}}
	c.compiler.DefaultDraft(jsonschema.Draft2020)
	c.compiler.AssertFormat()
	if err := c.compiler.AddResource(docURL, doc); err != nil {
		return nil, err
	}
	paths, _ := c.doc["paths"].(map[string]any)
	// A method a literal path does not take matches no operation, even
	// when a pattern of that method matches the path (GET /api/v1/tasks/kill
	// and GET /api/v1/tasks/{id}): 405, as the handler answers.
	for p, item := range paths {
		if strings.Contains(p, "{") {
			continue
		}
		for _, m := range []string{"get", "post", "put", "patch", "delete"} {
			if _, ok := item.(map[string]any)[m]; !ok {
				c.mux.HandleFunc(strings.ToUpper(m)+" "+p, func(http.ResponseWriter, *http.Request) {})
			}
		}
	}
	for p, item := range paths {
		for method := range item.(map[string]any) {
			if method == "parameters" {
				continue
			}
			m := strings.ToUpper(method)
			c.mux.HandleFunc(m+" "+p, func(w http.ResponseWriter, r *http.Request) {
				mt := r.Context().Value(matchKey{}).(*match)
				mt.path, mt.method = p, method
				mt.values = map[string]string{}
				for _, name := range pathParams.FindAllStringSubmatch(p, -1) {
					mt.values[name[1]] = r.PathValue(name[1])
				}
			})
		}
	}
	return c, nil
}

var pathParams = regexp.MustCompile(`\{([^}]+)\}`)

type matchKey struct{}

type match struct {
	path, method string
	values       map[string]string
}

// pointer escapes a JSON pointer's tokens.
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// schema compiles the schema at a JSON pointer of the document.
func (c *checker) schema(ptr string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.schemas[ptr]; ok {
		return s, nil
	}
	s, err := c.compiler.Compile(docURL + "#" + (&url.URL{Fragment: ptr}).EscapedFragment())
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", ptr, err)
	}
	c.schemas[ptr] = s
	return s, nil
}

// at returns the value at a pointer, and the pointer it ends at after
// following $refs.
func (c *checker) at(ptr string) (any, string) {
	for range 10 {
		v := any(c.doc)
		for _, tok := range strings.Split(ptr, "/")[1:] {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch x := v.(type) {
			case map[string]any:
				v = x[tok]
			case []any:
				i, _ := strconv.Atoi(tok)
				if i < 0 || i >= len(x) {
					return nil, ptr
				}
				v = x[i]
			default:
				return nil, ptr
			}
		}
		m, ok := v.(map[string]any)
		if !ok {
			return v, ptr
		}
		ref, ok := m["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#/") {
			return v, ptr
		}
		ptr = ref[1:]
	}
	return nil, ptr
}

func (c *checker) validate(ptr string, v any) error {
	s, err := c.schema(ptr)
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// exchange is one request and its response.
type exchange struct {
	method, target string
	reqHeader      http.Header
	reqBody        []byte
	status         int
	header         http.Header
	body           []byte
}

// check returns what in the exchange the document does not describe.
func (c *checker) check(x exchange) error {
	req := httptest.NewRequest(x.method, x.target, nil)
	mt := &match{}
	c.mux.ServeHTTP(httptest.NewRecorder(), req.WithContext(context.WithValue(req.Context(), matchKey{}, mt)))
	if mt.path == "" {
		// No operation: the handler's own 404 or 405.
		if x.status != http.StatusNotFound && x.status != http.StatusMethodNotAllowed {
			return fmt.Errorf("%s %s matches no operation of the document, yet got %d", x.method, x.target, x.status)
		}
		if x.status == http.StatusMethodNotAllowed && x.header.Get("Allow") == "" {
			return fmt.Errorf("%s %s: 405 without Allow", x.method, x.target)
		}
		return c.checkJSON(x, "/components/schemas/Error")
	}
	opPtr := pointer("paths", mt.path, mt.method)
	respPtr := pointer("paths", mt.path, mt.method, "responses", strconv.Itoa(x.status))
	resp, respPtr := c.at(respPtr)
	r, ok := resp.(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s: status %d is not declared for %s %s (body %s)", x.method, x.target, x.status, mt.method, mt.path, clip(string(x.body)))
	}
	if hs, ok := r["headers"].(map[string]any); ok {
		for name, h := range hs {
			if req, _ := h.(map[string]any)["required"].(bool); req && x.header.Get(name) == "" {
				return fmt.Errorf("%s %s: %d lacks the required header %s", x.method, x.target, x.status, name)
			}
		}
	}
	content, _ := r["content"].(map[string]any)
	ct := x.header.Get("Content-Type")
	switch {
	case content == nil && len(x.body) > 0:
		return fmt.Errorf("%s %s: %d has a body, the document declares none", x.method, x.target, x.status)
	case content != nil && ct == "":
		return fmt.Errorf("%s %s: %d has no Content-Type", x.method, x.target, x.status)
	}
	if content != nil {
		mediaType, _, err := mime.ParseMediaType(ct)
		if err != nil {
			return fmt.Errorf("%s %s: Content-Type %q: %w", x.method, x.target, ct, err)
		}
		if _, ok := content[mediaType]; !ok {
			return fmt.Errorf("%s %s: %d with Content-Type %s; the document declares %v", x.method, x.target, x.status, mediaType, keys(content))
		}
		schemaPtr := respPtr + pointer("content", mediaType, "schema")
		switch mediaType {
		case "application/json":
			if err := c.checkJSON(x, schemaPtr); err != nil {
				return err
			}
		case "text/plain":
			if err := c.validate(schemaPtr, string(x.body)); err != nil {
				return fmt.Errorf("%s %s: %w", x.method, x.target, err)
			}
		}
	}
	return c.checkRequest(x, req, opPtr, mt)
}

func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

func (c *checker) checkJSON(x exchange, schemaPtr string) error {
	if mt, _, _ := mime.ParseMediaType(x.header.Get("Content-Type")); mt != "application/json" {
		return fmt.Errorf("%s %s: %d with Content-Type %q, want application/json", x.method, x.target, x.status, x.header.Get("Content-Type"))
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(x.body))
	if err != nil {
		return fmt.Errorf("%s %s: %d: the body is not JSON: %w: %s", x.method, x.target, x.status, err, clip(string(x.body)))
	}
	if err := c.validate(schemaPtr, v); err != nil {
		return fmt.Errorf("%s %s: %d: the body does not match %s: %w\nbody: %s", x.method, x.target, x.status, schemaPtr, err, clip(string(x.body)))
	}
	return nil
}

// inputCodes are the 400 codes that say the input breaks the document.
var inputCodes = map[string]bool{CodeInvalidField: true, CodeMissingField: true, CodeUnknownField: true, CodeInvalidParameter: true}

// checkRequest: the document must call a request valid that got a 2xx,
// and invalid one that got a 400 about its input.
func (c *checker) checkRequest(x exchange, req *http.Request, opPtr string, mt *match) error {
	var problems []error
	if x.status < 300 {
		problems = c.requestProblems(x, req, opPtr, mt)
		if len(problems) > 0 {
			return fmt.Errorf("%s %s: %d, but the document calls the request invalid: %w", x.method, x.target, x.status, errors.Join(problems...))
		}
		return nil
	}
	if x.status != http.StatusBadRequest {
		return nil
	}
	var e errorBody
	if err := json.Unmarshal(x.body, &e); err != nil || !inputCodes[e.Error.Code] {
		return nil
	}
	if len(c.requestProblems(x, req, opPtr, mt)) == 0 {
		return fmt.Errorf("%s %s: 400 %s (%s), but the document calls the request valid (body %s)", x.method, x.target, e.Error.Code, e.Error.Message, clip(string(x.reqBody)))
	}
	return nil
}

func (c *checker) requestProblems(x exchange, req *http.Request, opPtr string, mt *match) []error {
	var problems []error
	op, _ := c.at(opPtr)
	// Parameters of the path item and of the operation.
	var params []string
	itemPtr := opPtr[:strings.LastIndex(opPtr, "/")]
	for _, base := range []string{itemPtr, opPtr} {
		ps, _ := c.at(base + "/parameters")
		if list, isList := ps.([]any); isList {
			for i := range list {
				params = append(params, base+"/parameters/"+strconv.Itoa(i))
			}
		}
	}
	// A query that does not parse, or is not UTF-8, no schema can call
	// valid: JSON Schema strings are Unicode.
	query, err := url.ParseQuery(req.URL.RawQuery)
	if err != nil {
		problems = append(problems, err)
	}
	for k, vs := range query {
		if !utf8.ValidString(k + strings.Join(vs, "")) {
			problems = append(problems, fmt.Errorf("query parameter %q is not UTF-8", k))
		}
	}
	for _, p := range params {
		pv, pptr := c.at(p)
		pm := pv.(map[string]any)
		name, in := pm["name"].(string), pm["in"].(string)
		sptr := pptr + "/schema"
		sv, _ := c.at(sptr)
		typ, _ := sv.(map[string]any)["type"].(string)
		var v any
		present := true
		switch in {
		case "path":
			v = mt.values[name]
		case "header":
			vs := x.reqHeader.Values(name)
			present = len(vs) > 0
			if present {
				v = vs[0]
			}
		case "query":
			if pm["style"] == "deepObject" {
				obj := map[string]any{}
				for k, vs := range query {
					if strings.HasPrefix(k, name+"[") && strings.HasSuffix(k, "]") {
						var v any = vs[0]
						if len(vs) > 1 {
							a := make([]any, len(vs))
							for i, s := range vs {
								a[i] = s
							}
							v = a
						}
						obj[k[len(name)+1:len(k)-1]] = v
					}
				}
				present, v = len(obj) > 0, obj
				break
			}
			vs, ok := query[name]
			present = ok
			switch {
			case !ok:
			case typ == "array":
				a := make([]any, len(vs))
				for i, s := range vs {
					a[i] = s
				}
				v = a
			case len(vs) > 1:
				problems = append(problems, fmt.Errorf("%s given %d times", name, len(vs)))
			case typ == "integer":
				v = vs[0]
				if regexp.MustCompile(`^-?[0-9]+$`).MatchString(vs[0]) {
					v = json.Number(vs[0])
				}
			case typ == "boolean":
				v = vs[0]
				if vs[0] == "true" || vs[0] == "false" {
					v = vs[0] == "true"
				}
			default:
				v = vs[0]
			}
		}
		if !present {
			if req, _ := pm["required"].(bool); req {
				problems = append(problems, fmt.Errorf("parameter %s is required", name))
			}
			continue
		}
		if err := c.validate(sptr, v); err != nil {
			problems = append(problems, fmt.Errorf("parameter %s: %w", name, err))
		}
	}
	if rb, ok := op.(map[string]any)["requestBody"].(map[string]any); ok && (len(x.reqBody) > 0 || rb["required"] == true) {
		// An optional body left out (empty, whatever its Content-Type)
		// is valid.
		mediaType, _, _ := mime.ParseMediaType(x.reqHeader.Get("Content-Type"))
		content, _ := rb["content"].(map[string]any)
		if _, declared := content[mediaType]; !declared {
			problems = append(problems, fmt.Errorf("request Content-Type %q is not declared", x.reqHeader.Get("Content-Type")))
		} else if v, err := jsonschema.UnmarshalJSON(bytes.NewReader(x.reqBody)); err != nil {
			problems = append(problems, fmt.Errorf("request body: %w", err))
		} else if err := c.validate(opPtr+pointer("requestBody", "content", mediaType, "schema"), v); err != nil {
			problems = append(problems, fmt.Errorf("request body: %w", err))
		}
	}
	return problems
}
