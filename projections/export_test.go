package projections

import "time"

// Crash stops the service the way a dying process would: the lease is not
// released and a successor must wait for it to expire.
func (s *Service) Crash() {
	s.elector.Abandon()
	s.Stop()
}

// Record adds lags as a committed batch of len(lags) events does.
func (s *Service) Record(lags ...time.Duration) { s.recorded(lags, len(lags), nil) }
