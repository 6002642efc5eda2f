package projections

// Crash stops the service the way a dying process would: the lease is not
// released and a successor must wait for it to expire.
func (s *Service) Crash() {
	s.elector.Abandon()
	s.Stop()
}
