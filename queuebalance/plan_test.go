package queuebalance

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// at is a time of the week in local time: day 0 Sunday.
func at(day, h, m int) time.Time {
	// 2026-11-22 is a Sunday.
	return time.Date(2026, 11, 22+day, h, m, 0, 0, time.Local)
}

// TestMaxTasksChoosesAs4103 is the table 4.103's QueueBalance gives (read
// from its code and tried): by day, then hour, then minute.
func TestMaxTasksChoosesAs4103(t *testing.T) {
	t.Parallel()
	entries := map[string]int{"* 07:00": 5, "* 19:00": 10, "1 07:00": 6, "5 19:00": 15}
	for _, tc := range []struct {
		name string
		when time.Time
		want int
	}{
		{"Mon 03:00: before today's first hour, today's latest", at(1, 3, 0), 10},
		{"Mon 07:00: Monday's own entry wins over *", at(1, 7, 0), 6},
		{"Fri 19:30: Friday's own", at(5, 19, 30), 15},
		{"Sat 00:00: Saturday has * entries, its latest hour wraps", at(6, 0, 0), 10},
		{"Sat 07:00", at(6, 7, 0), 5},
		{"Sun 12:00", at(0, 12, 0), 5},
	} {
		got, err := MaxTasks(entries, tc.when)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
	got, err := MaxTasks(map[string]int{"* 07:30": 5, "* 19:00": 10}, at(2, 7, 10))
	require.NoError(t, err)
	require.Equal(t, 5, got, "an entry applies from the start of its hour when the hour matches")
	got, err = MaxTasks(map[string]int{"3 12:00": 4}, at(3, 11, 0))
	require.NoError(t, err)
	require.Equal(t, 4, got, "the same day's only hour")
	got, err = MaxTasks(map[string]int{"3 12:00": 4, "1 08:00": 2}, at(2, 9, 0))
	require.NoError(t, err)
	require.Equal(t, 2, got, "the latest earlier day")

	for _, bad := range []map[string]int{{}, {"8 07:00": 1}, {"* 24:00": 1}, {"*07:00": 1}, {"* 07:00": -1}} {
		_, err := MaxTasks(bad, at(1, 7, 0))
		require.Error(t, err, "%v", bad)
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	// One group: the whole cap, split evenly, never above what is queued,
	// the remainder to the first queue still short.
	require.Equal(t, map[string]int{"a": 4, "b": 3, "c": 3}, Plan([][]Queue{{{"a", 100, 0}, {"b", 100, 0}, {"c", 100, 0}}}, 10))
	require.Equal(t, map[string]int{"a": 2, "b": 8}, Plan([][]Queue{{{"a", 2, 0}, {"b", 100, 0}}}, 10))
	// Later groups come first: the default group gets what their queued
	// tasks leave of the cap, then each later group what the groups
	// before it hold (running, or their cap when larger) leave.
	require.Equal(t, map[string]int{"d": 0, "x": 3, "y": 17}, Plan([][]Queue{{{"d", 100, 0}}, {{"x", 3, 0}, {"y", 100, 0}}}, 20))
	require.Equal(t, map[string]int{"d": 18, "x": 2}, Plan([][]Queue{{{"d", 100, 0}}, {{"x", 2, 0}}}, 20))
	// What the default group runs beyond its cap is taken from the later
	// groups (it is not killed, only not given more).
	require.Equal(t, map[string]int{"d": 18, "x": 0}, Plan([][]Queue{{{"d", 100, 25}}, {{"x", 2, 0}}}, 20))
	// A queue's need is its queued and running tasks: a busy queue with a
	// short backlog keeps a cap its running tasks fit under (a cap of its
	// queued tasks alone, 4.103's, kept its last 5 waiting for 15 of the
	// running to end).
	require.Equal(t, map[string]int{"a": 20}, Plan([][]Queue{{{"a", 5, 20}}}, 20))
	require.Equal(t, map[string]int{"a": 7, "b": 13}, Plan([][]Queue{{{"a", 1, 6}, {"b", 100, 0}}}, 20))
	require.Equal(t, map[string]int{"d": 18, "x": 2}, Plan([][]Queue{{{"d", 100, 0}}, {{"x", 0, 2}}}, 20), "x's running tasks count in the later group's need")
	require.Empty(t, Plan(nil, 10))
}
