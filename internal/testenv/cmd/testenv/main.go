// Command testenv starts a private PostgreSQL and ZooKeeper on free loopback ports, exports
// their addresses (LEAF_TEST_PG, LEAF_TEST_ZK, …) and runs a command with them, stopping
// both servers when the command ends. With -serve it prints the exports and keeps the
// servers up until interrupted, for working on the tests by hand.
//
//	go run ./internal/testenv/cmd/testenv -- go test -race ./...
//	eval "$(go run ./internal/testenv/cmd/testenv -serve &)"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

func main() {
	serve := flag.Bool("serve", false, "print the exports and keep the servers running until interrupted")
	noZK := flag.Bool("no-zk", false, "do not start ZooKeeper")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: testenv [-no-zk] -- command [args…]\n       testenv -serve [-no-zk]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if !*serve && flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(*serve, !*noZK, flag.Args()))
}

func run(serve, withZK bool, args []string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer pg.Close()
	env := map[string]string{
		testenv.EnvPostgres: pg.URL("postgres"),
		testenv.EnvPGBin:    pg.BinDir,
		testenv.EnvPGCA:     pg.CAFile,
	}
	if withZK {
		zk, err := testenv.StartZooKeeper(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 1
		}
		defer zk.Close()
		env[testenv.EnvZooKeeper] = zk.Addr()
		env[testenv.EnvZKClasspath] = testenv.FindZooKeeperClasspath()
	}
	for k, v := range env {
		os.Setenv(k, v)
	}
	fmt.Fprintf(os.Stderr, "testenv: PostgreSQL %s (%s) on port %d", filepath.Base(filepath.Dir(pg.BinDir)), pg.Dir, pg.Port)
	if withZK {
		fmt.Fprintf(os.Stderr, ", ZooKeeper on %s", env[testenv.EnvZooKeeper])
	}
	fmt.Fprintln(os.Stderr)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if serve {
		for k, v := range env {
			fmt.Printf("export %s=%q\n", k, v)
		}
		<-sigs
		return 0
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	return 0
}
