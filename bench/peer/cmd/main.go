// Command memcached-peer is the seed's Kubebuilder Memcached controller manager
// (main.go of `kubebuilder init --domain cache.example.com`), moved to the
// Kubebuilder 4 layout (cmd/main.go) and to today's controller-runtime, with the
// benchmark flags listed in bench/peer/README.md.
package main

import (
	"flag"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	// +kubebuilder:scaffold:imports

	memcachedv1 "memcached-operator/bench/peer/api/v1"
	"memcached-operator/bench/peer/internal/controller"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))

	utilruntime.Must(memcachedv1.AddToScheme(scheme))
	// +kubebuilder:scaffold:scheme
}

// userAgentPrefix is the User-Agent every request of the peer carries, so that
// the API server's audit log / httplog can tell it from the Rust operator.
const userAgentPrefix = "memcached-peer"

func main() {
	var metricsAddr string
	var probeAddr string
	var enableLeaderElection bool
	var maxConcurrentReconciles int
	var kubeAPIQPS float64
	var kubeAPIBurst int
	var namespace string
	var userAgent string
	var syncPeriod time.Duration
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "The address the metric endpoint binds to. "+
		"Use :8080 for HTTP, or leave as 0 to disable the metrics service.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0", "The address the probe endpoint binds to. "+
		"Use :8081, or leave as 0 to disable it.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false,
		"Enable leader election for controller manager. "+
			"Enabling this will ensure there is only one active controller manager.")
	flag.IntVar(&maxConcurrentReconciles, "max-concurrent-reconciles", 1,
		"Maximum number of concurrent Reconciles of the Memcached controller (controller-runtime's default is 1).")
	flag.Float64Var(&kubeAPIQPS, "kube-api-qps", 0,
		"Client-side QPS limit towards the API server. Unset (0) leaves the rest.Config as controller-runtime returns it: "+
			"since v0.21 that is QPS=-1, i.e. no client-side rate limiter. A negative value also disables it.")
	flag.IntVar(&kubeAPIBurst, "kube-api-burst", 0,
		"Client-side burst towards the API server. Unset (0) leaves the rest.Config's value (0; client-go then uses 10 "+
			"if a positive QPS is set).")
	flag.StringVar(&namespace, "namespace", "",
		"If set, restrict the manager's cache (and so the controller) to this namespace. Default: all namespaces.")
	flag.StringVar(&userAgent, "user-agent", userAgentPrefix,
		"User-Agent of the peer's requests. A value that does not start with \""+userAgentPrefix+"\" is sent as "+
			"\""+userAgentPrefix+"/<value>\" (e.g. --user-agent=tuned gives memcached-peer/tuned).")
	flag.DurationVar(&syncPeriod, "sync-period", 0,
		"If set, the cache's resync period (cache.Options.SyncPeriod; controller-runtime's default is 10h with jitter). "+
			"Benchmark addition: lets the steady-state cost per resync be measured in a short window.")
	opts := zap.Options{
		Development: true,
	}
	opts.BindFlags(flag.CommandLine)
	// --kubeconfig is registered on flag.CommandLine by controller-runtime's
	// pkg/client/config (used by ctrl.GetConfigOrDie), which also honours KUBECONFIG.
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	restConfig := ctrl.GetConfigOrDie()
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "kube-api-qps":
			restConfig.QPS = float32(kubeAPIQPS)
		case "kube-api-burst":
			restConfig.Burst = kubeAPIBurst
		}
	})
	if !strings.HasPrefix(userAgent, userAgentPrefix) {
		userAgent = userAgentPrefix + "/" + userAgent
	}
	restConfig.UserAgent = userAgent

	cacheOpts := cache.Options{}
	if syncPeriod > 0 {
		cacheOpts.SyncPeriod = &syncPeriod
	}
	if namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		LeaderElection:         enableLeaderElection,
		LeaderElectionID:       "memcached-peer.cache.example.com",
		Cache:                  cacheOpts,
		Controller:             config.Controller{MaxConcurrentReconciles: maxConcurrentReconciles},
	})
	if err != nil {
		setupLog.Error(err, "unable to start manager")
		os.Exit(1)
	}

	if err = (&controller.MemcachedReconciler{
		Client: mgr.GetClient(),
		Scheme: mgr.GetScheme(),
	}).SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "unable to create controller", "controller", "Memcached")
		os.Exit(1)
	}
	// +kubebuilder:scaffold:builder

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up ready check")
		os.Exit(1)
	}

	setupLog.Info("starting manager", "userAgent", restConfig.UserAgent, "qps", restConfig.QPS,
		"burst", restConfig.Burst, "maxConcurrentReconciles", maxConcurrentReconciles, "namespace", namespace)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "problem running manager")
		os.Exit(1)
	}
}
