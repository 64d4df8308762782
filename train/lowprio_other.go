//go:build !linux

package train

// lowerWriterPriority is a no-op where thread priorities are not set.
func lowerWriterPriority() {}

// addWriterProc is a no-op where the writer's thread keeps the normal
// priority: an extra processor would let it compete with training threads
// as their equal.
func addWriterProc() (release func()) { return func() {} }
