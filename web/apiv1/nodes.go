package apiv1

import (
	"errors"
	"net/http"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func (h *handler) nodeList(w http.ResponseWriter, r *http.Request) error {
	res, err := h.st.NodeList(r.Context())
	if err != nil {
		return err
	}
	for _, m := range res.Malformed {
		h.log.Warn("skipping a node document that cannot be read", "error", m)
	}
	out := struct {
		Nodes   []Node `json:"nodes"`
		Skipped int    `json:"skipped"`
	}{Nodes: make([]Node, 0, len(res.Nodes)), Skipped: len(res.Malformed)}
	for _, n := range res.Nodes {
		out.Nodes = append(out.Nodes, nodeView(n, res.Now))
	}
	return writeJSON(w, http.StatusOK, out)
}

// nodeByRef reads the node a path parameter names: its _id as 24 hex
// digits, else its name (as Disbatch 4.103 reads :node).
func (h *handler) nodeByRef(r *http.Request, ref string) (schema.Node, error) {
	raw, err := h.st.NodeDoc(r.Context(), ref)
	if errors.Is(err, store.ErrNotFound) {
		return schema.Node{}, errorf(http.StatusNotFound, CodeNotFound, "node", "no node with the name or id %q", clip(ref))
	}
	if err != nil {
		return schema.Node{}, err
	}
	return schema.DecodeNode(raw)
}

// writeNode answers a node with its heartbeat's age by the server's clock.
func (h *handler) writeNode(w http.ResponseWriter, r *http.Request, n schema.Node) error {
	now, err := h.st.ServerNow(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, nodeView(n, now))
}

func (h *handler) nodeGet(w http.ResponseWriter, r *http.Request) error {
	n, err := h.nodeByRef(r, r.PathValue("node"))
	if err != nil {
		return err
	}
	return h.writeNode(w, r, n)
}

func (h *handler) nodePatch(w http.ResponseWriter, r *http.Request) error {
	v, aerr := h.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	o, aerr := asObject(v, nil, "maxthreads")
	if aerr != nil {
		return aerr
	}
	mv, at, aerr := o.require("maxthreads")
	if aerr != nil {
		return aerr
	}
	mt, aerr := wantMaxThreads(mv, at)
	if aerr != nil {
		return aerr
	}
	ref := r.PathValue("node")
	res, err := h.st.NodeMaxThreadsSet(r.Context(), store.NodeMaxThreadsSetParams{Ref: ref, MaxThreads: mt})
	if err != nil {
		return err
	}
	if res.Matched == 0 {
		return errorf(http.StatusNotFound, CodeNotFound, "node", "no node with the name or id %q", clip(ref))
	}
	n, err := h.nodeByRef(r, ref)
	if err != nil {
		return err
	}
	return h.writeNode(w, r, n)
}

func (h *handler) nodeDrain(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("node")
	name := ref
	if hexID.MatchString(ref) {
		n, err := h.nodeByRef(r, ref)
		if err != nil {
			return err
		}
		name = n.Node
	}
	n, err := h.st.NodeDrain(r.Context(), store.NodeDrainParams{Node: name})
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusNotFound, CodeNotFound, "node", "no node with the name or id %q", clip(ref))
	}
	if err != nil {
		return err
	}
	return h.writeNode(w, r, n)
}
