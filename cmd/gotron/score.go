package main

import (
	"context"
	"errors"
)

func cmdScore(ctx context.Context, env *cli, args []string) error {
	return errors.New("not implemented yet")
}
