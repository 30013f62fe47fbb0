package main

import (
	"fmt"
	"strconv"
	"strings"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/server/adminapi"
)

// The admin API's JSON answers, declared once in server/adminapi; the
// names are the CLI's.
type (
	teamInfo          = adminapi.Team
	projectInfo       = adminapi.Project
	deployKeyInfo     = adminapi.DeployKey
	cacheInfo         = adminapi.Cache
	jobKinds          = adminapi.WorkerSettings
	credentialInfo    = adminapi.NewCredential
	registrationInfo  = adminapi.Registration
	teamWorkerInfo    = adminapi.TeamWorker
	workerStatusInfo  = authority.WorkerStatus
	hostInfo          = authority.HostStatus
	projectWorkerInfo = adminapi.ProjectWorker
	workerInfo        = adminapi.Worker
	linkInfo          = adminapi.Link
	activationInfo    = adminapi.Activation
	serverInfo        = adminapi.Server
)

// projectWildcards is the project's patterns as --wildcards takes them.
func projectWildcards(p projectInfo) string { return orDash(strings.Join(p.Wildcards, ", ")) }

// hostArchitectures and hostSlots are the list's columns; "-" before the worker
// reported its host.
func hostArchitectures(h *hostInfo) string {
	if h == nil {
		return "-"
	}
	return listOrDash(h.Architectures)
}

func hostSlots(h *hostInfo) string {
	if h == nil {
		return "-"
	}
	return strconv.FormatUint(uint64(h.MaxConcurrentBuilds), 10)
}

// hostPairs are the host's lines in worker show.
func hostPairs(h *hostInfo) []string {
	if h == nil {
		return []string{"host", "- (not reported yet)"}
	}
	load := "-"
	if h.RAMFreeMB != nil {
		load = fmt.Sprintf("%d MB RAM free", *h.RAMFreeMB)
		if h.CPUUsagePct != nil {
			load = fmt.Sprintf("%.0f%% CPU, %s", *h.CPUUsagePct, load)
		}
	}
	return []string{
		"architectures", listOrDash(h.Architectures),
		"system features", listOrDash(h.SystemFeatures),
		"build slots", hostSlots(h),
		"cpus", fmt.Sprintf("%d (core score %d)", h.CPUCount, h.CPUCoreScore),
		"ram", fmt.Sprintf("%d MB", h.RAMTotalMB),
		"zone", orDash(h.Zone),
		"load", load,
	}
}
