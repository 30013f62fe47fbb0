// Package server is the Gradient server's authority side: registrations,
// authorization of worker sessions, the durable job queue and dispatch.
package server
