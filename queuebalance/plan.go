package queuebalance

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"time"
)

// keyRe is a max_tasks key as 4.103's POST /balance accepts it: a day (*
// for every day, 0 Sunday to 6 Saturday), a space, HH:MM.
var keyRe = regexp.MustCompile(`^([*0-6]) ((?:[01]\d|2[0-3])):([0-5]\d)$`)

// MaxTasks is the cap max_tasks gives at now (local time), chosen as
// 4.103's QueueBalance chooses it: "*" entries stand for every day and a
// day's own entry at the same time wins over them; then the day is today's
// if it has entries, else the latest earlier day, else (a week's wrap) the
// latest day; within that day the hour the same way, within that hour the
// minute. So the choice goes by day, then hour, then minute, not to the
// latest entry at or before now.
func MaxTasks(entries map[string]int, now time.Time) (int, error) {
	if len(entries) == 0 {
		return 0, errors.New("max_tasks has no entries")
	}
	days := map[int]map[int]map[int]int{}
	set := func(day, h, m, v int) {
		if days[day] == nil {
			days[day] = map[int]map[int]int{}
		}
		if days[day][h] == nil {
			days[day][h] = map[int]int{}
		}
		days[day][h][m] = v
	}
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys) // "*" sorts before the digits: a day's own entries overwrite it
	for _, k := range keys {
		m := keyRe.FindStringSubmatch(k)
		if m == nil {
			return 0, fmt.Errorf("max_tasks key %q: want \"D HH:MM\" (D: * or 0-6)", k)
		}
		if entries[k] < 0 {
			return 0, fmt.Errorf("max_tasks %q: %d is negative", k, entries[k])
		}
		h, _ := strconv.Atoi(m[2])
		mi, _ := strconv.Atoi(m[3])
		if m[1] == "*" {
			for d := range 7 {
				set(d, h, mi, entries[k])
			}
			continue
		}
		d, _ := strconv.Atoi(m[1])
		set(d, h, mi, entries[k])
	}
	day := pick(keysOf(days), int(now.Weekday()))
	hour := pick(keysOf(days[day]), now.Hour())
	minute := pick(keysOf(days[day][hour]), now.Minute())
	return days[day][hour][minute], nil
}

func keysOf[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// pick is want if present, else the largest below it, else the largest.
func pick(sorted []int, want int) int {
	best := -1
	for _, v := range sorted {
		if v <= want {
			best = v
		}
	}
	if best >= 0 {
		return best
	}
	return sorted[len(sorted)-1]
}

// Queue is one queue of a group, as the plan sees it.
type Queue struct {
	Name string
	// Queued are the tasks that may run now (status -2). 4.103 counted
	// every status <= -2; its nodes made none of the others, where ours
	// hold tasks (-4: a delay, a retry's backoff, parents to wait for) and
	// orphan them (-6), which a cap could not run, and would take the
	// share of queues whose tasks can.
	Queued  int
	Running int // status -1 or 0
}

// need is what q could use: its running tasks and those that may run.
func (q Queue) need() int { return q.Queued + q.Running }

// Plan gives each queue of the groups its cap, as 4.103's QueueBalance
// meant to: groups[0] is the default group, which gets what the later
// groups' needs leave of max (all of it when it is the only group);
// each later group gets what the groups before it hold (their running
// tasks, or their caps when larger) leave; a group's share is split evenly
// among its queues, never above a queue's need (its queued and running
// tasks: 4.103 left the running out, which its nodes never enforced, and
// a cap below them would keep a busy queue's last tasks waiting), and the
// first queue still short of its need also gets the group's remainder.
func Plan(groups [][]Queue, max int) map[string]int {
	out := map[string]int{}
	if len(groups) == 0 {
		return out
	}
	reserved := 0 // for the later groups' needs
	for _, g := range groups[1:] {
		for _, q := range g {
			reserved += q.need()
		}
	}
	reserved = min(reserved, max)
	split := func(g []Queue, avail int) {
		if len(g) == 0 {
			return
		}
		avail = maxInt(0, avail)
		sum := 0
		for _, q := range g {
			out[q.Name] = min(avail/len(g), q.need())
			sum += out[q.Name]
		}
		for _, q := range g {
			if out[q.Name] < q.need() {
				out[q.Name] += avail - sum
				break
			}
		}
	}
	split(groups[0], max-reserved)
	held := 0
	for i := 1; i < len(groups); i++ {
		for _, q := range groups[i-1] {
			held += maxInt(q.Running, out[q.Name])
		}
		need := 0
		for _, q := range groups[i] {
			need += q.need()
		}
		split(groups[i], min(max-held, need))
	}
	return out
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
