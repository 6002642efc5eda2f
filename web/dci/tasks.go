package dci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// maxParamsDepth bounds the nesting of a task's params.
const maxParamsDepth = 64

// toBSON converts a decoded JSON value for storage: integers as int32
// when they fit (as Perl's driver writes them), else int64, other numbers
// as doubles; objects with their keys sorted.
func toBSON(v any, depth int) (any, error) {
	if depth > maxParamsDepth {
		return nil, fmt.Errorf("nested more than %d deep", maxParamsDepth)
	}
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			if i >= -1<<31 && i < 1<<31 {
				return int32(i), nil
			}
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s is out of range", x)
		}
		return f, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			if strings.ContainsRune(k, 0) {
				return nil, errors.New("a key contains a NUL character")
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := make(bson.D, len(keys))
		for i, k := range keys {
			val, err := toBSON(x[k], depth+1)
			if err != nil {
				return nil, err
			}
			d[i] = bson.E{Key: k, Value: val}
		}
		return d, nil
	case []any:
		a := make(bson.A, len(x))
		for i, el := range x {
			val, err := toBSON(el, depth+1)
			if err != nil {
				return nil, err
			}
			a[i] = val
		}
		return a, nil
	}
	return v, nil
}

func paramsDoc(m map[string]any) (bson.Raw, error) {
	d, err := toBSON(m, 0)
	if err != nil {
		return nil, err
	}
	return bson.Marshal(d)
}

// POST /tasks
func (h *Handler) tasksCreate(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	h.postTasks(w, r, nil)
}

// postTasks is 4.103's post_tasks: the request's parameters, with preset
// ones (the legacy routes' path segments) over them.
func (h *Handler) postTasks(w http.ResponseWriter, r *http.Request, preset map[string]any) {
	p := readParams(r)
	if p.bad != nil {
		send(w, http.StatusBadRequest, obj{"error": "invalid JSON body"}, false)
		return
	}
	fields := p.fields
	if p.body != nil { // a bare array is {"params": [...]}
		fields = map[string]any{"params": p.body}
	}
	for k, v := range preset {
		fields[k] = v
	}
	ref, _ := scalar(fields["queue"])
	queue, err := h.o.Store.QueueResolve(r.Context(), ref)
	if errors.Is(err, store.ErrNotFound) || ref == "" {
		send(w, http.StatusBadRequest, obj{"error": "queue not found"}, false)
		return
	}
	if err != nil {
		h.dbError(r, "resolve queue", err)
		send(w, http.StatusBadRequest, obj{"error": errText(err)}, false)
		return
	}
	h.createTasks(w, r, queue, fields)
}

// createTasks is POST /tasks once the queue is known: {queue, params:
// [objects]} (form A), {queue, params: object} (A'), or {queue, params:
// template, collection, filter} (B); anything else is refused.
func (h *Handler) createTasks(w http.ResponseWriter, r *http.Request, queue bson.ObjectID, fields map[string]any) {
	keys := map[string]bool{}
	for k := range fields {
		keys[k] = true
	}
	delete(keys, "queue")
	_, hasFilter := fields["filter"]
	list, isList := fields["params"].([]any)
	one, isObj := fields["params"].(map[string]any)
	var docs []bson.Raw
	switch {
	case isList && len(keys) == 1:
		if len(list) == 0 {
			send(w, http.StatusBadRequest, obj{"error": "'params' must be a JSON array of task params objects"}, false)
			return
		}
		for _, el := range list {
			if _, ok := el.(map[string]any); !ok {
				send(w, http.StatusBadRequest, obj{"error": "'params' must be a JSON array of task params objects"}, false)
				return
			}
		}
		for _, el := range list {
			d, msg := taskParams(el.(map[string]any))
			if msg != "" {
				send(w, http.StatusBadRequest, obj{"error": msg}, false)
				return
			}
			docs = append(docs, d)
		}
	case isObj && len(keys) == 1:
		d, msg := taskParams(one)
		if msg != "" {
			send(w, http.StatusBadRequest, obj{"error": msg}, false)
			return
		}
		docs = []bson.Raw{d}
	case isObj && hasFilter && len(keys) <= 3 && (len(keys) == 2 || keys["collection"]):
		var msg string
		docs, msg = h.collectionTasks(r.Context(), one, fields)
		if msg != "" {
			send(w, http.StatusBadRequest, obj{"error": msg}, false)
			return
		}
	default:
		send(w, http.StatusBadRequest, obj{"error": "invalid parameters passed"}, false)
		return
	}
	h.insertTasks(w, r, queue, docs)
}

// taskParams checks and converts one params object; the message is the
// 400's when it is refused.
func taskParams(m map[string]any) (bson.Raw, string) {
	if len(m) == 0 {
		return nil, "'params' must be a JSON array of task params objects with key/value pairs"
	}
	d, err := paramsDoc(m)
	if err != nil {
		return nil, "'params' " + err.Error()
	}
	return d, ""
}

func (h *Handler) insertTasks(w http.ResponseWriter, r *http.Request, queue bson.ObjectID, docs []bson.Raw) {
	result := obj{"acknowledged": 1, "inserted": []any{}, "write_errors": []any{}, "write_concern_errors": []any{}}
	if len(docs) == 0 {
		send(w, http.StatusBadRequest, obj{insertManyResultKey: result, "error": "Unknown error"}, false)
		return
	}
	p := store.TaskInsertManyParams{Queue: queue, Parameters: docs, Dialect4103: true}
	p.TraceParent, p.TraceState = tracing.FromHeader(r.Header)
	ids, err := h.o.Store.TaskInsertMany(r.Context(), p)
	if err != nil {
		h.dbError(r, "insert tasks", err)
		send(w, http.StatusBadRequest, obj{driverError: obj{"message": errText(err)}, "error": errText(err)}, false)
		return
	}
	inserted := make([]any, len(ids))
	for i, id := range ids {
		inserted[i] = obj{"index": i, "_id": oid(id)}
	}
	result["inserted"] = inserted
	send(w, http.StatusOK, obj{insertManyResultKey: result}, false)
}

// collectionTasks is form B: one task per document of a collection
// matching a filter, the template's "document.<field>" values replaced by
// the document's fields. It returns the 400 message on bad input.
func (h *Handler) collectionTasks(ctx context.Context, tmpl map[string]any, fields map[string]any) ([]bson.Raw, string) {
	filter, ok := fields["filter"].(map[string]any)
	if !ok {
		return nil, "'filter' must be a JSON object"
	}
	coll, ok := scalar(fields["collection"])
	if !ok || coll == "" {
		return nil, "'collection' required and must be a scalar (string)'"
	}
	if k := serverCode(filter); k != "" {
		return nil, "'filter': " + serverCodeRefused(k)
	}
	fd, err := toBSON(filter, 0)
	if err != nil {
		return nil, "'filter' " + err.Error()
	}
	proj := bson.D{}
	for _, v := range tmpl {
		if s, ok := v.(string); ok && strings.HasPrefix(s, "document.") {
			proj = append(proj, bson.E{Key: strings.TrimPrefix(s, "document."), Value: 1})
		}
	}
	sort.Slice(proj, func(i, j int) bool { return proj[i].Key < proj[j].Key })
	if len(proj) == 0 {
		proj = bson.D{{Key: "_id", Value: 1}}
	}
	found, err := h.o.Store.DocumentsFind(ctx, store.DocumentsFindParams{Collection: coll, Filter: fd.(bson.D), Projection: proj, Limit: h.o.MaxCollectionTasks})
	if err != nil {
		return nil, driverErrText(err)
	}
	docs := make([]bson.Raw, 0, len(found))
	for _, src := range found {
		m := make(map[string]any, len(tmpl))
		for k, v := range tmpl {
			if s, ok := v.(string); ok && strings.HasPrefix(s, "document.") {
				val, err := src.LookupErr(strings.Split(strings.TrimPrefix(s, "document."), ".")...)
				if err != nil {
					m[k] = nil
					continue
				}
				m[k] = rawValue(val)
				continue
			}
			m[k] = v
		}
		d, err := paramsDoc(m)
		if err != nil {
			return nil, "'params' " + err.Error()
		}
		docs = append(docs, d)
	}
	return docs, ""
}

// rawValue keeps a BSON value as it is through toBSON.
func rawValue(v bson.RawValue) any { return v }

var looksNumeric = regexp.MustCompile(`^-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$`)

// indexLists are the lists of keys GET /tasks may filter on, read from the
// indexes of tasks as 4.103 reads them, by their names: the first "_-1"
// of a name is read as "_1"; an index whose name so read begins another's
// is dropped; the rest come in name order, each name cut into its keys at
// "_1_" ("_id_" is _id, and _id is "id"). So an index an operator named
// lists its name, as in 4.103. A name that does not cut into as many keys
// as the index has (4.103 fails the request) lists the keys themselves.
func indexLists(indexes []store.TaskIndex) [][]string {
	byName := make(map[string][]string, len(indexes))
	for _, ix := range indexes {
		byName[sortName(ix.Name)] = ix.Keys
	}
	names := slices.Sorted(maps.Keys(byName))
	var out [][]string
	for _, name := range names {
		if slices.ContainsFunc(names, func(other string) bool { return len(other) > len(name) && strings.HasPrefix(other, name) }) {
			continue
		}
		keys := byName[name]
		l := strings.SplitN(strings.TrimSuffix(name, "_1"), "_1_", len(keys))
		if len(l) != len(keys) {
			l = slices.Clone(keys)
		}
		if len(l) > 0 && l[0] == "_id_" {
			l[0] = "_id"
		}
		for i, k := range l {
			if k == "_id" {
				l[i] = "id"
			}
		}
		out = append(out, l)
	}
	return out
}

// descending is a descending key in an index name, as 4.103 rewrites it.
var descending = regexp.MustCompile(`_-1(_|$)`)

// sortName is an index's name as 4.103 sorts it: its first descending key
// read as ascending.
func sortName(name string) string {
	if loc := descending.FindStringIndex(name); loc != nil {
		return name[:loc[0]] + "_1" + name[loc[0]+3:]
	}
	return name
}

// validKey: a key is valid when it belongs to an index whose keys to its
// left are all given.
func validKey(k string, given map[string]bool, lists [][]string) bool {
	for _, l := range lists {
		for i, ik := range l {
			if ik != k {
				continue
			}
			ok := true
			for _, left := range l[:i] {
				if !given[left] {
					ok = false
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}

func listsJSON(lists [][]string) []any {
	out := make([]any, len(lists))
	for i, l := range lists {
		out[i] = stringsJSON(l)
	}
	return out
}

// emptyValue is a filter value 4.103 leaves out of the query (one Perl
// compares equal to the empty string): "", null and false.
func emptyValue(v any) bool {
	return v == nil || v == "" || v == false
}

// filterValue converts one query value: ObjectIds for id and queue,
// numbers for what looks like one (true and false among them, as Perl
// reads them: 1 and 0).
func filterValue(key string, v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case bool:
		if key == "id" || key == "queue" {
			return nil, fmt.Errorf("%s %v is not an ObjectId", key, x)
		}
		if x {
			return int32(1), nil
		}
		return int32(0), nil
	case json.Number:
		return toBSON(x, 0)
	case map[string]any:
		if s, ok := x["$oid"].(string); ok && len(x) == 1 && (key == "id" || key == "queue") {
			return filterValue(key, s)
		}
		return filterObject(key, x, 0)
	case []any:
		return nil, fmt.Errorf("%s must be a value or an array of values, not nested arrays", key)
	case string:
		if key == "id" || key == "queue" {
			id, err := bson.ObjectIDFromHex(x)
			if err != nil {
				return nil, fmt.Errorf("%s %q is not an ObjectId", key, x)
			}
			return id, nil
		}
		if looksNumeric.MatchString(x) {
			return toBSON(json.Number(x), 0)
		}
		return x, nil
	}
	return toBSON(v, 0)
}

// filterOperators are the query operators an object value of GET /tasks
// may use, with what each takes: 4.103 hands such an object to MongoDB as
// it is ({"status":{"$lte":0}}, {"node":{"$ne":null}}), so its CLI's
// filters work here too. Those that only apply at a query's top level or
// run code are left out: MongoDB would refuse them here anyway.
var filterOperators = map[string]string{
	"$eq": "value", "$ne": "value", "$gt": "value", "$gte": "value", "$lt": "value", "$lte": "value",
	"$in": "values", "$nin": "values", "$all": "values",
	"$exists": "any", "$type": "any", "$regex": "any", "$options": "any", "$mod": "any", "$size": "any",
	"$not": "operators",
}

// filterObject converts an object value of a GET /tasks filter: query
// operators (above), or, with no "$" key, a document to match as it is (as
// 4.103 does). The arguments of id's and queue's comparisons are ObjectIds,
// as their plain values are; other arguments keep their JSON types, as in
// 4.103 ({"$lte":"0"} compares a string).
func filterObject(key string, x map[string]any, depth int) (any, error) {
	if depth > maxParamsDepth {
		return nil, fmt.Errorf("%s nested more than %d deep", key, maxParamsDepth)
	}
	var ops, plain []string
	for k := range x {
		if strings.HasPrefix(k, "$") {
			ops = append(ops, k)
		} else {
			plain = append(plain, k)
		}
	}
	sort.Strings(ops)
	sort.Strings(plain)
	switch {
	case len(ops) == 0 && (key == "id" || key == "queue"):
		return nil, fmt.Errorf("%s must be an ObjectId, an array of them, or an object of query operators", key)
	case len(ops) == 0:
		return toBSON(x, depth)
	case len(plain) > 0:
		return nil, fmt.Errorf("%s mixes query operators (%s) with fields (%s) in one object", key, ops[0], plain[0])
	}
	d := make(bson.D, 0, len(ops))
	for _, op := range ops {
		var val any
		var err error
		arg := x[op]
		switch filterOperators[op] {
		case "value":
			val, err = operatorArg(key, op, arg)
		case "values":
			list, ok := arg.([]any)
			if !ok {
				return nil, fmt.Errorf("%s: %s needs an array", key, op)
			}
			a := make(bson.A, len(list))
			for i, el := range list {
				if a[i], err = operatorArg(key, op, el); err != nil {
					return nil, err
				}
			}
			val = a
		case "operators":
			inner, ok := arg.(map[string]any)
			if !ok || len(inner) == 0 {
				return nil, fmt.Errorf("%s: %s needs an object of query operators", key, op)
			}
			for k := range inner {
				if !strings.HasPrefix(k, "$") {
					return nil, fmt.Errorf("%s: %s needs an object of query operators", key, op)
				}
			}
			val, err = filterObject(key, inner, depth+1)
		case "any":
			val, err = toBSON(arg, depth+1)
		default:
			return nil, fmt.Errorf("%s: %s is not a query operator GET /tasks accepts (it accepts %s)", key, op, strings.Join(operatorNames(), " "))
		}
		if err != nil {
			return nil, err
		}
		d = append(d, bson.E{Key: op, Value: val})
	}
	return d, nil
}

// operatorArg converts one argument of a comparison: for id and queue an
// ObjectId (a hex string or {"$oid"}, read as their plain values are) or
// null, else the JSON value.
func operatorArg(key, op string, v any) (any, error) {
	if key != "id" && key != "queue" || v == nil {
		switch v.(type) {
		case map[string]any, []any:
			return nil, fmt.Errorf("%s: %s takes values, not objects or arrays", key, op)
		}
		return toBSON(v, 0)
	}
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		v = m["$oid"]
	}
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%s: %s takes ObjectIds", key, op)
	}
	return filterValue(key, s) // as a plain value of id or queue
}

func operatorNames() []string {
	names := slices.Collect(maps.Keys(filterOperators))
	sort.Strings(names)
	return names
}

// GET /tasks
func (h *Handler) tasksQuery(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	p := readParams(r)
	html := WantHTML(r)
	pretty := truthy(p.options["pretty"])
	fail := func(status int, o obj) {
		if html {
			htmlPage(w, status, pageData{H1: "Disbatch Tasks Query", Blocks: []template.HTML{textHTML(fmt.Sprint(o["error"]))}})
			return
		}
		send(w, status, o, pretty)
	}
	if p.bad != nil {
		fail(http.StatusBadRequest, obj{"error": "invalid JSON body"})
		return
	}
	keys, err := h.o.Store.TaskIndexKeys(r.Context())
	if err != nil {
		h.dbError(r, "list indexes", err)
		fail(http.StatusBadRequest, obj{"error": errText(err)})
		return
	}
	lists := indexLists(keys)
	base := obj{"title": "Disbatch Tasks Query", "path": "/tasks", "indexes": listsJSON(lists)}
	if html && len(p.fields) == 0 && len(p.options) == 0 {
		var form []string
		for _, l := range lists {
			for _, k := range l {
				if !slices.Contains(form, k) {
					form = append(form, k)
				}
			}
		}
		htmlPage(w, http.StatusOK, pageData{H1: "Disbatch Tasks Query", Form: form})
		return
	}
	// Every key given counts for the indexes, whatever its value (4.103's
	// own query form sends its empty fields too); an empty one is then
	// left out of the query.
	given := map[string]bool{}
	for _, k := range p.keys {
		given[k] = true
	}
	var invalid []any
	for _, k := range p.keys {
		if given[k] && !validKey(k, given, lists) {
			invalid = append(invalid, k)
		}
	}
	if len(invalid) > 0 {
		o := copyObj(base)
		o["error"], o["invalid_params"] = "non-indexed params given", invalid
		fail(http.StatusBadRequest, o)
		return
	}
	var terms bson.A
	for _, k := range p.keys {
		if emptyValue(p.fields[k]) {
			continue
		}
		field := k
		if k == "id" {
			field = "_id"
		}
		vals, isList := p.fields[k].([]any)
		if !isList {
			vals = []any{p.fields[k]}
		}
		if len(vals) == 0 {
			fail(http.StatusBadRequest, obj{"error": k + " must not be an empty array"})
			return
		}
		var or bson.A
		for _, v := range vals {
			fv, err := filterValue(k, v)
			if err != nil {
				fail(http.StatusBadRequest, obj{"error": err.Error()})
				return
			}
			or = append(or, bson.D{{Key: field, Value: fv}})
		}
		if len(or) == 1 {
			terms = append(terms, or[0])
		} else {
			terms = append(terms, bson.D{{Key: "$or", Value: or}})
		}
	}
	filter := bson.D{}
	if len(terms) > 0 {
		filter = bson.D{{Key: "$and", Value: terms}}
	}
	limit, _ := intOption(p.options["limit"])
	skip, _ := intOption(p.options["skip"])
	if truthy(p.options["count"]) {
		n, err := h.o.Store.TaskCount(r.Context(), filter, 0, 0)
		if err != nil {
			h.dbError(r, "count tasks", err)
			fail(http.StatusBadRequest, obj{"error": errText(err)})
			return
		}
		send(w, http.StatusOK, obj{"count": n}, pretty)
		return
	}
	if len(terms) == 0 && limit <= 0 {
		o := copyObj(base)
		o["error"] = "refusing to return everything - include one or more indexed search restrictions"
		fail(http.StatusBadRequest, o)
		return
	}
	proj, err := fieldsOption(p.options["fields"])
	if err != nil {
		fail(http.StatusBadRequest, obj{"error": err.Error()})
		return
	}
	docs, err := h.o.Store.TaskFind(r.Context(), store.TaskFindParams{Filter: filter, Projection: proj, Skip: skip, Limit: limit})
	if err != nil {
		h.dbError(r, "find tasks", err)
		fail(http.StatusBadRequest, obj{"error": errText(err)})
		return
	}
	dates := dateISO
	if truthy(p.options["epoch"]) {
		dates = dateEpoch
	}
	out := make([]any, 0, len(docs))
	for _, d := range docs {
		o, err := h.taskJSON(r.Context(), d, dates, truthy(p.options["terse"]), truthy(p.options["full"]))
		if err != nil {
			h.dbError(r, "read task output", err)
			fail(http.StatusBadRequest, obj{"error": errText(err)})
			return
		}
		out = append(out, o)
	}
	var body any = out
	switch {
	case len(out) == 0:
		body = obj{}
	case limit == 1:
		body = out[0]
	}
	if html {
		blocks := make([]template.HTML, len(out))
		for i, o := range out {
			blocks[i] = textHTML(encodeJSONString(o))
		}
		htmlPage(w, http.StatusOK, pageData{H1: "Disbatch Tasks Query Results", Count: strconv.Itoa(len(out)), Blocks: blocks})
		return
	}
	send(w, http.StatusOK, body, pretty)
}

// driverErrText is an error as 4.103 passes the Perl driver's on:
// MongoDB's own message under the driver's class name.
func driverErrText(err error) string {
	if msg, ok := store.ServerMessage(err); ok {
		return "MongoDB::DatabaseError: " + msg
	}
	return errText(err)
}

func encodeJSONString(v any) string { return strings.TrimSuffix(string(encodeJSON(v, true)), "\n") }

func copyObj(o obj) obj {
	c := make(obj, len(o))
	for k, v := range o {
		c[k] = v
	}
	return c
}

func intOption(v any) (int64, bool) {
	s, ok := scalar(v)
	if !ok || s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return int64(f), true
}

// fieldsOption reads .fields: an array of names, a projection object, or
// a JSON string of either; any other string is names separated by commas,
// which is what 4.103's CLI sends for --fields status,node (4.103's web
// answered it 500).
func fieldsOption(v any) (bson.D, error) {
	if s, ok := v.(string); ok && s != "" {
		parsed, err := decodeJSON([]byte(s))
		if err != nil {
			var names []any
			for _, n := range strings.Split(s, ",") {
				names = append(names, strings.TrimSpace(n))
			}
			parsed = names
		}
		v = parsed
	}
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return nil, nil
	case []any:
		d := bson.D{}
		for _, el := range x {
			s, ok := scalar(el)
			if !ok || s == "" {
				return nil, errors.New(".fields must name fields")
			}
			d = append(d, bson.E{Key: s, Value: 1})
		}
		if len(d) == 0 {
			return nil, nil
		}
		return d, nil
	case map[string]any:
		if k := serverCode(x); k != "" {
			return nil, errors.New(".fields: " + serverCodeRefused(k))
		}
		d, err := toBSON(x, 0)
		if err != nil {
			return nil, err
		}
		if len(d.(bson.D)) == 0 {
			return nil, nil
		}
		return d.(bson.D), nil
	}
	return nil, errors.New(".fields must be an array of field names or an object")
}

// taskJSON is a task document as GET /tasks answers it: terse replaces
// inline output with "[terse mode]", full replaces GridFS ids with their
// content, dates in dates style; 4.103 applies .epoch to ctime and mtime
// only, so every other date (a not_before, an attempt's times) stays ISO.
func (h *Handler) taskJSON(ctx context.Context, d bson.Raw, dates dateStyle, terse, full bool) (obj, error) {
	o := docToObj(d, dateISO)
	for _, k := range []string{schema.TaskCTime, schema.TaskMTime} {
		if v, err := d.LookupErr(k); err == nil && v.Type == bson.TypeDateTime {
			o[k] = formatDate(v.Time(), dates)
		}
	}
	for _, k := range []string{schema.TaskStdout, schema.TaskStderr} {
		v, err := d.LookupErr(k)
		if err != nil {
			continue
		}
		switch {
		case terse: // terse wins over full, as in 4.103
			if v.Type == bson.TypeString && v.StringValue() != "" {
				o[k] = "[terse mode]"
			}
		case v.Type == bson.TypeObjectID && full:
			text, err := h.o.Store.TaskOutputRead(ctx, schema.Output{FileID: v.ObjectID(), Set: true})
			if err != nil {
				return nil, fmt.Errorf("read %s of task: %w", k, err)
			}
			o[k] = text
		}
	}
	return o, nil
}

// GET /tasks/:id
func (h *Handler) task(w http.ResponseWriter, r *http.Request, m map[string]string) {
	id, _ := bson.ObjectIDFromHex(m["id"])
	docs, err := h.o.Store.TaskFind(r.Context(), store.TaskFindParams{Filter: bson.D{{Key: "_id", Value: id}}, Limit: 1})
	html := WantHTML(r)
	if err != nil {
		h.dbError(r, "read task", err)
		send(w, http.StatusBadRequest, obj{"error": errText(err)}, true)
		return
	}
	if len(docs) == 0 {
		if html {
			htmlPage(w, http.StatusNotFound, pageData{H1: "Disbatch Single Task Query Results", Blocks: []template.HTML{textHTML("Document(s) not found.")}})
			return
		}
		send(w, http.StatusNotFound, obj{"error": "no task with id " + m["id"]}, true)
		return
	}
	o := docToObj(docs[0], dateISO)
	if html {
		htmlPage(w, http.StatusOK, pageData{H1: "Disbatch Single Task Query Results", Count: "1", Blocks: []template.HTML{textHTML(encodeJSONString(o))}})
		return
	}
	send(w, http.StatusOK, o, true)
}
