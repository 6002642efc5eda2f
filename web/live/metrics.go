package live

import "github.com/prometheus/client_golang/prometheus"

// collector reads a hub's Stats at scrape time.
type collector struct {
	h                                       *Hub
	subs, replaying, preImages              *prometheus.Desc
	published, dropped, handovers, resetsTo *prometheus.Desc
}

// NewCollector returns a Prometheus collector of h's Stats, for the web
// server's registry: disbatch_web_events_subscribers,
// disbatch_web_events_replaying, disbatch_web_events_pre_images, and the
// counters
// disbatch_web_events_{published,dropped,handovers,resets}_total.
func NewCollector(h *Hub) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("disbatch_web_events_"+name, help, nil, nil)
	}
	return &collector{h: h,
		subs:      d("subscribers", "Clients connected to the live event stream."),
		replaying: d("replaying", "Clients that resumed from an old position, served by a replay of their own."),
		preImages: d("pre_images", "1 while the hub's change streams ask for task pre-images (the tasks collection keeps them), else 0."),
		published: d("published_total", "Change events the live hub's change stream delivered."),
		dropped:   d("dropped_total", "Clients dropped for falling too far behind (event lagged)."),
		handovers: d("handovers_total", "Replays handed over to the live hub once caught up."),
		resetsTo:  d("resets_total", "Reset events sent (change history lost, collections dropped)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.subs, c.replaying, c.preImages, c.published, c.dropped, c.handovers, c.resetsTo} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.h.Stats()
	ch <- prometheus.MustNewConstMetric(c.subs, prometheus.GaugeValue, float64(st.Subscribers))
	ch <- prometheus.MustNewConstMetric(c.replaying, prometheus.GaugeValue, float64(st.Replaying))
	preImages := 0.0
	if st.PreImages {
		preImages = 1
	}
	ch <- prometheus.MustNewConstMetric(c.preImages, prometheus.GaugeValue, preImages)
	ch <- prometheus.MustNewConstMetric(c.published, prometheus.CounterValue, float64(st.Published))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Dropped))
	ch <- prometheus.MustNewConstMetric(c.handovers, prometheus.CounterValue, float64(st.Handovers))
	ch <- prometheus.MustNewConstMetric(c.resetsTo, prometheus.CounterValue, float64(st.Resets))
}
