package dci

import (
	"fmt"
	"html/template"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// GET /balance
func (h *Handler) balance(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	o, err := h.balanceReport(r)
	if err != nil {
		h.dbError(r, "read balance", err)
		send(w, http.StatusBadRequest, obj{"error": errText(err)}, true)
		return
	}
	if WantHTML(r) {
		htmlPage(w, http.StatusOK, pageData{H2: "QueueBalancer settings", Blocks: []template.HTML{textHTML(encodeJSONString(o))}})
		return
	}
	send(w, http.StatusOK, o, true)
}

func (h *Handler) balanceReport(r *http.Request) (obj, error) {
	doc, err := h.o.Store.BalanceGet(r.Context())
	if err != nil {
		return nil, err
	}
	o := obj{}
	if doc == nil {
		o["notice"] = "balance document not found"
	} else {
		o = docToObj(doc, dateISO)
		delete(o, "_id")
	}
	queues, err := h.o.Store.QueueDocs(r.Context())
	if err != nil {
		return nil, err
	}
	names := []any{}
	for _, q := range queues {
		if n, ok := q.Lookup(schema.QueueName).StringValueOK(); ok {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i].(string) < names[j].(string) }) // distinct's order
	o["known_queues"] = names
	o["settings"] = settingsJSON(h.o.Balance)
	return o, nil
}

func settingsJSON(m map[string]any) obj {
	o := obj{}
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			o[k] = settingsJSON(x)
		case float64:
			o[k] = number(perlFloat(x))
		default:
			o[k] = x
		}
	}
	return o
}

var (
	queueNameRe = regexp.MustCompile(`^[\w-]+$`)
	maxTasksRe  = regexp.MustCompile(`^[*0-6] (?:[01]\d|2[0-3]):[0-5]\d$`)
)

// POST /balance
func (h *Handler) balanceSet(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	p := readParams(r)
	fail := func(detail string) {
		send(w, http.StatusBadRequest, obj{"status": "failed: invalid json passed " + detail}, false)
	}
	if p.bad != nil || p.body != nil {
		fail("(not a JSON object)")
		return
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range p.fields {
			if !yield(k) {
				return
			}
		}
	})
	k := strings.Join(keys, ",")
	if k != "max_tasks,queues" && k != "disabled,max_tasks,queues" {
		fail(fmt.Sprintf("(keys must be max_tasks and queues, and optionally disabled; got %s)", k))
		return
	}
	set := bson.D{}
	if v, ok := p.fields["disabled"]; ok && v == nil {
		set = append(set, bson.E{Key: "disabled", Value: nil})
	} else if ok {
		s, isScalar := scalar(v)
		n, err := strconv.ParseInt(s, 10, 64)
		if !isScalar || !digits.MatchString(s) || err != nil || (n != 0 && n < time.Now().Unix()) {
			fail("(disabled must be 0 or epoch seconds not in the past)")
			return
		}
		set = append(set, bson.E{Key: "disabled", Value: n})
	}
	groups, ok := p.fields["queues"].([]any)
	if !ok {
		fail("(queues must be an array of arrays of queue names)")
		return
	}
	docs, err := h.o.Store.QueueDocs(r.Context())
	if err != nil {
		h.dbError(r, "list queues", err)
		fail("(" + errText(err) + ")")
		return
	}
	known := map[string]bool{}
	for _, q := range docs {
		if n, ok := q.Lookup(schema.QueueName).StringValueOK(); ok {
			known[n] = true
		}
	}
	seen := map[string]bool{}
	qs := bson.A{}
	for _, g := range groups {
		names, ok := g.([]any)
		if !ok {
			fail("(queues must be an array of arrays of queue names)")
			return
		}
		a := bson.A{}
		for _, n := range names {
			s, ok := n.(string)
			switch {
			case !ok || !queueNameRe.MatchString(s):
				fail(fmt.Sprintf("(queue name %v is not valid)", n))
				return
			case !known[s]:
				fail(fmt.Sprintf("(queue %s does not exist)", s))
				return
			case seen[s]:
				fail(fmt.Sprintf("(queue %s is given twice)", s))
				return
			}
			seen[s] = true
			a = append(a, s)
		}
		qs = append(qs, a)
	}
	mt, ok := p.fields["max_tasks"].(map[string]any)
	if !ok {
		fail("(max_tasks must be an object)")
		return
	}
	mtKeys := make([]string, 0, len(mt))
	for k := range mt {
		mtKeys = append(mtKeys, k)
	}
	sort.Strings(mtKeys)
	mtDoc := bson.D{}
	for _, k := range mtKeys {
		s, isScalar := scalar(mt[k])
		n, err := strconv.ParseInt(s, 10, 64)
		if !maxTasksRe.MatchString(k) || !isScalar || !digits.MatchString(s) || err != nil {
			fail(fmt.Sprintf("(max_tasks %s)", k))
			return
		}
		mtDoc = append(mtDoc, bson.E{Key: k, Value: n})
	}
	set = append(set, bson.E{Key: "max_tasks", Value: mtDoc}, bson.E{Key: "queues", Value: qs})
	if err := h.o.Store.BalanceSet(r.Context(), set); err != nil {
		h.dbError(r, "set balance", err)
		fail("(" + errText(err) + ")")
		return
	}
	send(w, http.StatusOK, obj{"status": "success: queuebalance modified"}, false)
}

// GET /monitoring
func (h *Handler) monitoring(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	out := obj{}
	if !h.o.Monitoring {
		off := obj{"status": "OK", "message": "monitoring disabled"}
		send(w, http.StatusOK, obj{"disbatch": off, "queuebalance": off}, false)
		return
	}
	out["disbatch"] = h.monitorNodes(r)
	out["queuebalance"] = h.monitorBalance(r)
	send(w, http.StatusOK, out, false)
}

func (h *Handler) monitorNodes(r *http.Request) obj {
	docs, err := h.o.Store.NodeDocs(r.Context())
	if err != nil {
		return obj{"status": "CRITICAL", "message": "Could not get current Disbatch nodes: " + errText(err)}
	}
	if len(docs) == 0 {
		return obj{"status": "WARNING", "message": "No Disbatch nodes found"}
	}
	now, err := h.o.Store.ServerNow(r.Context())
	if err != nil {
		return obj{"status": "CRITICAL", "message": "Could not get current Disbatch nodes: " + errText(err)}
	}
	// As 4.103: ages are whole seconds of the server's clock minus whole
	// seconds of the heartbeat; fresh is always there, stale only when a
	// node is.
	fresh, stale := obj{}, obj{}
	for _, d := range docs {
		name, _ := d.Lookup(schema.NodeNode).StringValueOK()
		ts, ok := d.Lookup(schema.NodeTimestamp).TimeOK()
		age := int64(-1)
		if ok {
			age = now.Unix() - ts.Unix()
		}
		if ok && age <= 60 {
			fresh[name] = age
		} else {
			stale[name] = age
		}
	}
	nodes := obj{"fresh": fresh}
	if len(stale) > 0 {
		nodes["stale"] = stale
	}
	if len(fresh) > 0 {
		return obj{"status": "OK", "message": "Disbatch is running on one or more nodes", "nodes": nodes}
	}
	return obj{"status": "CRITICAL", "message": "No active Disbatch nodes found", "nodes": nodes}
}

func (h *Handler) monitorBalance(r *http.Request) obj {
	if !truthy(h.o.Balance["enabled"]) {
		return obj{"status": "OK", "message": "queuebalance disabled"}
	}
	doc, err := h.o.Store.BalanceGet(r.Context())
	if err != nil {
		return obj{"status": "CRITICAL", "message": "Could not get queuebalance status: " + errText(err)}
	}
	if doc == nil {
		return obj{"status": "CRITICAL", "message": "queuebalanced unknown status", "result": obj{}}
	}
	o := docToObj(doc, dateISO)
	delete(o, "_id")
	status, _ := doc.Lookup("status").StringValueOK()
	ts, hasTS := doc.Lookup("timestamp").AsInt64OK()
	if !hasTS {
		if t, ok := doc.Lookup("timestamp").TimeOK(); ok {
			ts, hasTS = t.Unix(), true
		}
	}
	switch {
	case status == "CRITICAL" && !hasTS:
		return o
	case hasTS && time.Now().Unix()-ts > 60:
		return obj{"status": "CRITICAL", "message": fmt.Sprintf("queuebalanced not running for %ds", time.Now().Unix()-ts)}
	case status == "OK" || status == "WARNING" || status == "CRITICAL":
		return obj{"status": status, "message": o["message"]}
	}
	return obj{"status": "CRITICAL", "message": "queuebalanced unknown status", "result": o}
}
