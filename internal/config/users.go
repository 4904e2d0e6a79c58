package config

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// This file holds the users setting: pool settings of one user that win over those of
// the database it uses and over the global ones, as PgBouncer's [users] section:
//
//	users:
//	  reporting: pool_mode=session
//	  batch: {pool_size: 5}
//
// and as flags --user 'reporting=pool_mode=session' (repeatable), or LEAFPROXY_USERS with
// entries separated by ';'.

// User is one entry of the users setting.
type User struct {
	// Name is the user name a client logs in with.
	Name string
	// PoolMode is the pool mode of the user's sessions; empty: the database's.
	PoolMode string
	// PoolSize is the most server connections of the user per database; 0: the
	// database's.
	PoolSize int
}

// String renders the entry as the flag that gives it.
func (u User) String() string {
	return u.Name + "=" + strings.Join(appendPoolKeys(nil, u.PoolMode, []namedInt{{"pool_size", u.PoolSize}}), " ")
}

// Users is the value of the users setting, in the order given.
type Users []User

// Lookup returns the entry of a user name.
func (us Users) Lookup(name string) (User, bool) {
	for _, u := range us {
		if u.Name == name {
			return u, true
		}
	}
	return User{}, false
}

// String renders the setting as LEAFPROXY_USERS would give it.
func (us Users) String() string {
	parts := make([]string, len(us))
	for i, u := range us {
		parts[i] = u.String()
	}
	return strings.Join(parts, "; ")
}

// userExample is an entry of the users setting, for messages.
const userExample = "reporting=pool_mode=session"

// Set replaces the setting with the entries of s: NAME=KEY=VALUE…, separated by ';' or
// new lines.
func (us *Users) Set(s string) error {
	*us = nil
	return addEntries(splitEntries(s), "user", userExample, us.addEntry)
}

// setFlags replaces the setting with the entries of repeated --user flags.
func (us *Users) setFlags(vals []string) error {
	*us = nil
	for _, v := range vals {
		if err := addEntries(splitEntries(v), "user", userExample, us.addEntry); err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalYAML reads a mapping of user names to key=value strings or to mappings of the
// same keys.
func (us *Users) UnmarshalYAML(n *yaml.Node) error {
	*us = nil
	return unmarshalEntries(n, "user", "reporting: pool_mode=session", us.addEntry)
}

// userKeys are the keys of a users entry, for messages.
var userKeys = []string{"pool_mode", "pool_size"}

// userNotSupported names PgBouncer's [users] keys leafproxy does not have, with why.
var userNotSupported = map[string]string{
	"max_user_connections":        "pool_size bounds the user's server connections per database",
	"max_user_client_connections": "max-client-conns bounds all sessions",
	"reserve_pool_size":           "there is no reserve pool: raise pool_size",
}

// addEntry checks the keys of one entry and appends it.
func (us *Users) addEntry(name string, kvs []connParam) error {
	if name == "" {
		return errors.New("a user entry has an empty name")
	}
	if strings.ContainsRune(name, 0) {
		return fmt.Errorf("user %q: the name contains a NUL byte", name)
	}
	if _, dup := us.Lookup(name); dup {
		return fmt.Errorf("user %q is given twice", name)
	}
	u := User{Name: name}
	seen := map[string]bool{}
	for _, kv := range kvs {
		if seen[kv.key] {
			return fmt.Errorf("user %q: key %q given twice", name, kv.key)
		}
		seen[kv.key] = true
		switch kv.key {
		case "pool_mode":
			if err := parsePoolMode(kv.value, &u.PoolMode); err != nil {
				return fmt.Errorf("user %q: %w", name, err)
			}
		case "pool_size":
			n, err := parsePoolNumber(kv.key, kv.value)
			if err != nil {
				return fmt.Errorf("user %q: %w", name, err)
			}
			u.PoolSize = n
		default:
			if why, ok := userNotSupported[kv.key]; ok {
				return fmt.Errorf("user %q: key %q is not supported: %s", name, kv.key, why)
			}
			return unknownKey("user", name, kv.key, userKeys)
		}
	}
	if len(kvs) == 0 {
		return fmt.Errorf("user %q sets nothing (want %s)", name, strings.Join(userKeys, " or "))
	}
	*us = append(*us, u)
	return nil
}

// checkUsers refuses a user in transaction mode when the proxy relays the login.
func checkUsers(c *Config, bad problem) {
	for _, u := range c.Users {
		if u.PoolMode == PoolModeTransaction && !c.proxyAuthenticates() {
			bad("user %q: pool_mode %s", u.Name, transactionNeedsAuth)
		}
	}
}
