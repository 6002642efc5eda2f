package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeQueueSched(t *testing.T) {
	t.Parallel()
	base := `{"_id":` + qid + `,"name":"q","constructor":"C"`
	for _, tc := range []struct {
		name, fields string
		want         QueueSched
	}{
		{name: "defaults", fields: ``, want: QueueSched{Weight: 20}},
		{name: "all set", fields: `,"priority":{"$numberInt":"5"},"weight":{"$numberDouble":"2.5"},"max_getwork":{"$numberLong":"3"},"paused":true`,
			want: QueueSched{Priority: 5, Weight: 2.5, MaxGetwork: 3, Paused: true}},
		{name: "nice gives 20 - nice", fields: `,"nice":{"$numberInt":"5"}`, want: QueueSched{Weight: 15}},
		{name: "weight wins over nice", fields: `,"weight":{"$numberInt":"1"},"nice":{"$numberInt":"5"}`, want: QueueSched{Weight: 1}},
		{name: "negative weight is not scheduled", fields: `,"weight":{"$numberInt":"-1"}`, want: QueueSched{Weight: -1}},
		{name: "nice above 20 is not scheduled", fields: `,"nice":{"$numberInt":"21"}`, want: QueueSched{Weight: -1}},
		{name: "disabled at creation is paused", fields: `,"disabled":true`, want: QueueSched{Weight: 20, Paused: true}},
		{name: "paused false wins over disabled", fields: `,"disabled":true,"paused":false`, want: QueueSched{Weight: 20}},
		{name: "negative priority", fields: `,"priority":{"$numberDouble":"-1.5"}`, want: QueueSched{Priority: -1.5, Weight: 20}},
		{name: "nulls are defaults", fields: `,"priority":null,"weight":null,"max_getwork":null,"paused":null`, want: QueueSched{Weight: 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := DecodeQueue(doc(t, base+tc.fields+`}`))
			require.NoError(t, err)
			require.Equal(t, tc.want, q.Sched)
		})
	}
	for _, tc := range []struct{ name, fields, field string }{
		{"string weight", `,"weight":"heavy"`, "weight"},
		{"string priority", `,"priority":"high"`, "priority"},
		{"NaN weight", `,"weight":{"$numberDouble":"NaN"}`, "weight"},
		{"infinite priority", `,"priority":{"$numberDouble":"Infinity"}`, "priority"},
		{"negative max_getwork", `,"max_getwork":{"$numberInt":"-1"}`, "max_getwork"},
		{"fractional max_getwork", `,"max_getwork":{"$numberDouble":"1.5"}`, "max_getwork"},
		{"string nice", `,"nice":"x"`, "nice"},
		{"paused as string", `,"paused":"yes"`, "paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeQueue(doc(t, base+tc.fields+`}`))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.field)
		})
	}
}
