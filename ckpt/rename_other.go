//go:build !linux

package ckpt

import "errors"

// exchangeDirs is unsupported here; replaceDir falls back to two renames.
func exchangeDirs(a, b string) error { return errors.New("rename exchange not supported") }
