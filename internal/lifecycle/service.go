package lifecycle

import "context"

// Service is what every long-lived part of this project is: started,
// stopped, and observable in between. A type that embeds Base and defines
// Start(ctx) error is one.
type Service interface {
	Start(ctx context.Context) error
	Stop()
	Started() <-chan struct{}
	Stopped() <-chan struct{}
}
