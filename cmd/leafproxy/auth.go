package main

import (
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/proxy"
)

// clientAuth returns the proxy's client authentication per the auth-* settings; nil for
// passthrough.
func clientAuth(cfg *config.Config) *proxy.ClientAuth {
	if cfg.AuthType == config.AuthPassthrough {
		return nil
	}
	return &proxy.ClientAuth{
		Type:     proxy.AuthType(cfg.AuthType),
		File:     cfg.AuthFile,
		User:     cfg.AuthUser,
		Query:    cfg.AuthQuery,
		Password: cfg.AuthPassword,
	}
}
