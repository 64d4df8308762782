package commtest

import (
	"sync"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// SimDevices wraps each rank's group in a comm.SimDevice, or with Refuse
// in a Refusing one, and keeps them, so that a test running its ranks as
// goroutines can count the device collectives they all ran. Wrap may be
// called concurrently.
type SimDevices struct {
	Refuse bool

	mu     sync.Mutex
	groups []*comm.SimDevice
}

// Wrap gives pg the simulated device's collectives (none with Refuse).
func (s *SimDevices) Wrap(pg comm.ProcessGroup) comm.ProcessGroup {
	g := comm.NewSimDevice(pg)
	s.mu.Lock()
	s.groups = append(s.groups, g)
	s.mu.Unlock()
	if s.Refuse {
		return Refusing{g}
	}
	return g
}

// Calls is the number of device collectives the wrapped groups (and the
// groups made from them) ran.
func (s *SimDevices) Calls() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, g := range s.groups {
		n += g.Calls()
	}
	return n
}

// Refusing is a comm.SimDevice whose DeviceTensor accepts no tensor, and
// whose sub-groups are alike: its callers must stage every collective
// through the host as over a group without device collectives.
type Refusing struct{ *comm.SimDevice }

// DeviceTensor refuses t.
func (Refusing) DeviceTensor(*tensor.Tensor) bool { return false }

// NewGroup makes the sub-group, refusing too.
func (g Refusing) NewGroup(ranks []int) (comm.ProcessGroup, error) {
	sub, err := g.SimDevice.NewGroup(ranks)
	if err != nil {
		return nil, err
	}
	return Refusing{sub.(*comm.SimDevice)}, nil
}
