package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Same-host shared memory (NCCL's shm transport, simplified).
//
// At Join, the higher rank of every pair (the dialer) offers a shared
// memory file after the hello: its host key (hostname, boot id and mount
// namespace, so two containers that cannot see each other's /dev/shm do not
// try) and the file's path. The lower rank maps the file, unlinks it and
// answers 1, or answers 0 (other host, shm disabled, map failed); the pair
// then uses sockets only. The file holds one single-producer
// single-consumer byte ring per direction.
//
// Frames keep going over the socket, but a frame whose payload is at least
// shmMinBytes sets bit 63 of its length and its payload travels through the
// ring instead. The socket thus still orders every frame, carries small
// ones and abort notices, and its EOF still says the peer died: a rank
// waiting on the ring polls its socket whenever it sleeps longer than
// shmPoll.

// shmMinBytes is the smallest payload sent through shared memory; smaller
// ones go in the same write as their header.
const shmMinBytes = 1024

// shmPoll is the longest a rank waiting on shared memory sleeps before it
// looks for a failure (the peer's socket, ctx, the timeout).
const shmPoll = 10 * time.Millisecond

// shmPiece is the most a ring write copies before publishing its head, and
// the most a ring read hands out at once.
const shmPiece = 256 << 10

// shmFlag marks a frame length whose payload is in the ring.
const shmFlag = uint64(1) << 63

// DefaultShmBytes is the ring size per direction for a zero Config.ShmBytes.
const DefaultShmBytes = 4 << 20

// maxOffer bounds the offer message (host key and path).
const maxOffer = 4096

// errShmAbandoned is returned by a ring read when the socket carries data
// while the current frame's payload is missing: the peer gave up on the
// frame (its send failed) and went on to an abort notice or closed.
var errShmAbandoned = errors.New("peer abandoned a shared-memory frame")

// TransportStats counts what this rank sent to its peers, by route.
type TransportStats struct {
	// Peers is the number of other ranks in the world.
	Peers int
	// ShmPeers is the number of them reached through shared memory.
	ShmPeers int
	// ShmBytes and SocketBytes count payload bytes sent each way.
	ShmBytes, SocketBytes uint64
	// RegionBytes counts payload bytes this rank copied into groups'
	// shared regions.
	RegionBytes uint64
}

// Transport returns "shm" when every peer is reached through shared memory,
// "socket" when none is, and "shm+socket" otherwise ("none" for one rank).
func (s TransportStats) Transport() string {
	switch {
	case s.Peers == 0:
		return "none"
	case s.ShmPeers == s.Peers:
		return "shm"
	case s.ShmPeers == 0:
		return "socket"
	}
	return "shm+socket"
}

// Stats returns the world's transport counters (shared by all its groups).
func (g *Group) Stats() TransportStats {
	var s TransportStats
	for _, pc := range g.w.conns {
		if pc == nil {
			continue
		}
		s.Peers++
		if pc.shm != nil {
			s.ShmPeers++
		}
		s.ShmBytes += pc.shmSent.Load()
		s.SocketBytes += pc.sockSent.Load()
	}
	g.w.mu.Lock()
	for _, r := range g.w.regions {
		s.RegionBytes += r.copied.Load()
	}
	g.w.mu.Unlock()
	return s
}

// TransportName describes the route to the peers for reports, e.g.
// "shm (3 of 3 peers through shared memory; group region for large
// collectives, 2 MiB slots)".
func (g *Group) TransportName() string {
	s := g.Stats()
	name := fmt.Sprintf("%s (%d of %d peers through shared memory", s.Transport(), s.ShmPeers, s.Peers)
	if g.regionState == regionOn {
		name += fmt.Sprintf("; group region for large collectives, %d KiB slots", g.region.slot>>10)
	}
	return name + ")"
}

// hostKey identifies the host and mount namespace, or "" when it cannot be
// told (then no shared memory is tried).
func hostKey() string {
	host, err := os.Hostname()
	if err != nil {
		return ""
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return ""
	}
	return host + "|" + strings.TrimSpace(string(boot)) + "|" + ns
}

// writeOffer sends the dialer's offer ("" for none).
func writeOffer(c net.Conn, key, path string) error {
	msg := ""
	if path != "" {
		msg = key + "\n" + path
	}
	b := make([]byte, 4+len(msg))
	binary.LittleEndian.PutUint32(b, uint32(len(msg)))
	copy(b[4:], msg)
	_, err := c.Write(b)
	return err
}

// readOffer reads the dialer's offer; path is "" for none.
func readOffer(c net.Conn) (key, path string, err error) {
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return "", "", err
	}
	n := binary.LittleEndian.Uint32(b[:])
	if n == 0 {
		return "", "", nil
	}
	if n > maxOffer {
		return "", "", fmt.Errorf("shared-memory offer of %d bytes exceeds %d", n, maxOffer)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return "", "", err
	}
	key, path, ok := strings.Cut(string(msg), "\n")
	if !ok {
		return "", "", errors.New("malformed shared-memory offer")
	}
	return key, path, nil
}

// answerShm is the accepting side of the offer: it reads the offer, maps
// the file when it can and answers whether it did.
func (w *world) answerShm(c net.Conn) (*shmLink, error) {
	key, path, err := readOffer(c)
	if err != nil {
		return nil, err
	}
	var link *shmLink
	if path != "" && !w.cfg.NoShm && key != "" && key == w.hostKey {
		link = openShm(path, w.cfg.ShmBytes) // nil on failure: sockets only
	}
	ans := []byte{0}
	if link != nil {
		ans[0] = 1
	}
	if _, err := c.Write(ans); err != nil {
		if link != nil {
			link.unmap()
		}
		return nil, err
	}
	return link, nil
}

// offerShm is the dialing side: it creates a file, offers it and keeps it
// if the peer mapped it.
func (w *world) offerShm(c net.Conn) (*shmLink, error) {
	var link *shmLink
	var path string
	if !w.cfg.NoShm && w.hostKey != "" {
		link, path = createShm(w.cfg.ShmBytes)
	}
	if link != nil {
		defer os.Remove(path) // the peer unlinks it once mapped; this covers its refusal
	}
	err := writeOffer(c, w.hostKey, path)
	var ans [1]byte
	if err == nil {
		_, err = io.ReadFull(c, ans[:])
	}
	switch {
	case err != nil:
		if link != nil {
			link.unmap()
		}
		return nil, err
	case ans[0] == 1 && link == nil:
		return nil, errors.New("peer accepted a shared-memory offer never made")
	case ans[0] != 1 && link != nil:
		link.unmap()
		return nil, nil
	}
	return link, nil
}
