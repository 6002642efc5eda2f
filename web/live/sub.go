package live

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"
)

type endReason int

const (
	endLagged  endReason = iota + 1 // fell Buffer events behind
	endStopped                      // the hub stops
)

// sub is one subscriber: what it asked for, and the events waiting for
// its handler to write them.
type sub struct {
	filter filter
	max    int
	fromID string
	remote string
	ctx    context.Context // ends with the handler or the hub's run
	cancel context.CancelFunc
	wake   chan struct{} // something was queued
	space  chan struct{} // the handler took the queue
	ended  chan struct{} // closed by end

	mu       sync.Mutex
	queue    []*item
	pos      string // the position after everything offered so far
	closed   bool
	reason   endReason
	rc       *http.ResponseController // set once the stream started
	kicked   bool                     // writes are cut short
	finished bool                     // the handler returned: rc is dead

	// Guarded by Hub.mu.
	attached bool // the hub feeds it
	private  bool // a replay of its own feeds it
	cut      *cut // handed over at cut, which the hub has not passed yet
}

func newSub(req request, max int, remote string) *sub {
	return &sub{filter: req.filter, max: max, fromID: req.fromID, remote: remote,
		wake: make(chan struct{}, 1), space: make(chan struct{}, 1), ended: make(chan struct{})}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// offer queues items and moves the position to pos (when not ""), or
// reports false when they do not fit.
func (s *sub) offer(items []*item, pos string) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return true
	}
	if len(s.queue)+len(items) > s.max {
		s.mu.Unlock()
		return false
	}
	s.queue = append(s.queue, items...)
	if pos != "" {
		s.pos = pos
	}
	s.mu.Unlock()
	if len(items) > 0 {
		signal(s.wake)
	}
	return true
}

// offerWait queues items, waiting for room as long as it takes: a replay
// goes at its client's pace. False when the subscriber ended.
func (s *sub) offerWait(items []*item, pos string) bool {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false
		}
		n := min(s.max-len(s.queue), len(items))
		s.queue = append(s.queue, items[:n]...)
		items = items[n:]
		if len(items) == 0 && pos != "" {
			s.pos = pos
		}
		s.mu.Unlock()
		if n > 0 {
			signal(s.wake)
		}
		if len(items) == 0 {
			return true
		}
		select {
		case <-s.space:
		case <-s.ctx.Done():
			return false
		}
	}
}

func (s *sub) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// take hands the queue to the handler.
func (s *sub) take() []*item {
	s.mu.Lock()
	q := s.queue
	s.queue = nil
	s.mu.Unlock()
	signal(s.space)
	return q
}

// idlePosition is the position after everything offered, when all of it
// was taken (and so written): an id the client may resume from.
func (s *sub) idlePosition() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		return ""
	}
	return s.pos
}

// end closes the subscriber; a stopping hub also cuts its writes short.
func (s *sub) end(why endReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed, s.reason, s.queue = true, why, nil
		close(s.ended)
		s.cancel()
	}
	if why == endStopped {
		s.kicked = true
		if s.rc != nil && !s.finished {
			_ = s.rc.SetWriteDeadline(time.Now())
		}
	}
}

// deadline bounds the next write; false once writes are cut short.
func (s *sub) deadline(d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kicked {
		return false
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(d))
	return true
}

// finish is the handler's last word: what the server still writes after
// it (the end of the response) may not block long.
func (s *sub) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rc != nil && !s.kicked {
		_ = s.rc.SetWriteDeadline(time.Now().Add(time.Second))
	}
	s.finished = true
}

// ServeHTTP serves GET: the event stream (see the package doc).
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		h.fail(w, r, &Error{Status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed, Message: "the event stream answers GET only"})
		return
	}
	req, e := h.parse(r.Context(), r)
	if e != nil {
		h.fail(w, r, e)
		return
	}
	s, e := h.join(r, req)
	if e != nil {
		h.fail(w, r, e)
		return
	}
	defer h.leave(s)
	h.stream(w, r, s)
}

func errUnavailable() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
		Message: "the event stream is not running (the server is starting or stopping); try again"}
}

// join registers a subscriber with the hub: fed by the hub from now, from
// a position the hub remembers, or by a replay of its own from an older
// one. Once it returns, every change committed afterwards reaches s.
func (h *Hub) join(r *http.Request, req request) (*sub, *Error) {
	s := newSub(req, h.opts.Buffer, r.RemoteAddr)
	h.mu.Lock()
	if !h.running {
		h.mu.Unlock()
		return nil, errUnavailable()
	}
	s.ctx, s.cancel = context.WithCancel(h.runCtx)
	h.all[s] = struct{}{}
	h.handlers.Add(1)
	if req.from == nil {
		// From the present: the hub's position is the client's, which
		// its first frame gives it, so that a client dropped (or cut
		// off) before its first event still resumes without loss.
		s.fromID = h.pos
		s.mu.Lock()
		s.pos = h.pos
		s.mu.Unlock()
		h.attach(s)
		h.mu.Unlock()
		return s, nil
	}
	if seq, ok := h.ring.find(req.fromID); ok {
		if backlog, ok := h.ring.after(seq, &s.filter, s.max/2); ok {
			s.offer(backlog, h.pos)
			h.attach(s)
			h.mu.Unlock()
			return s, nil
		}
	}
	s.private = true
	h.mu.Unlock()

	stop := context.AfterFunc(r.Context(), s.cancel)
	defer stop()
	rd, err := h.opts.Store.StreamOpen(s.ctx, h.params(req))
	if err != nil {
		gone := s.ctx.Err() != nil // the client went, or the hub stops
		h.leave(s)
		if gone {
			return nil, errUnavailable()
		}
		h.log.Warn("live events: open a replay", "error", err)
		return nil, &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: "could not resume the event stream; try again"}
	}
	h.mu.Lock()
	if !h.running || s.ctx.Err() != nil {
		h.mu.Unlock()
		rd.Close()
		h.leave(s)
		return nil, errUnavailable()
	}
	h.readers.Add(1)
	h.mu.Unlock()
	go h.replay(s, rd, req)
	return s, nil
}

// leave unregisters s once its handler is done.
func (h *Hub) leave(s *sub) {
	h.mu.Lock()
	delete(h.all, s)
	delete(h.attached, s)
	h.mu.Unlock()
	s.cancel()
	s.finish()
	h.handlers.Done()
}

// stream writes s's events until the client goes, falls behind, or the
// hub stops.
func (h *Hub) stream(w http.ResponseWriter, r *http.Request, s *sub) {
	rc := http.NewResponseController(w)
	// Lift the server's timeouts for the stream: its write timeout would
	// cut it, and so would its read timeout (net/http cancels the request
	// when its background read of an idle connection times out). Each
	// write gets a deadline of its own instead.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	s.mu.Lock()
	s.rc = rc
	s.mu.Unlock()
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	if r.ProtoMajor == 1 {
		// A stream's connection is never reused: it ends when the client
		// or the server gives up, or after a write deadline.
		hd.Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)

	var buf bytes.Buffer
	last := s.fromID // the last id the client has, or is given now
	write := func() bool {
		if !s.deadline(h.opts.WriteTimeout) {
			return false
		}
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		if err == nil {
			err = rc.Flush()
		}
		return err == nil
	}
	buf.WriteString("retry: " + strconv.FormatInt(h.opts.Retry.Milliseconds(), 10) + "\n")
	if last != "" {
		// Where it joins (the id it gave, or the hub's position): a
		// client cut off before its first event resumes from there.
		buf.WriteString("id: " + last + "\n")
	}
	buf.WriteString("\n")
	if !write() {
		return
	}
	ka := h.opts.Clock.NewTicker(h.opts.KeepAlive)
	defer ka.Stop()
	for {
		select {
		case <-s.ended:
			if s.reason == endLagged {
				buf.Write(laggedFrame(s.max, last))
				_ = write()
			}
			return
		default:
		}
		select {
		case <-s.ended:
		case <-r.Context().Done():
			return
		case <-s.wake:
			for _, it := range s.take() {
				buf.Write(it.frame)
				if it.id != "" {
					last = it.id
				}
			}
			if buf.Len() > 0 && !write() {
				return
			}
		case <-ka.C():
			buf.WriteString(": keep-alive\n")
			if pos := s.idlePosition(); pos != "" && pos != last {
				// An id alone moves the client's last event id on, past
				// the events it did not ask for, without an event.
				buf.WriteString("id: " + pos + "\n")
				last = pos
			}
			buf.WriteByte('\n')
			if !write() {
				return
			}
		}
	}
}
