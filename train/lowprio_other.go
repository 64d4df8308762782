//go:build !linux

package train

// lowerWriterPriority is a no-op where thread priorities are not set.
func lowerWriterPriority() {}
