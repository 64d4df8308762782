package main

import (
	"context"
	"errors"
)

func cmdParallel(ctx context.Context, env *cli, args []string) error {
	return errors.New("not implemented yet")
}
