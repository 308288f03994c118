// Command gpu-upgrade-controller runs NVIDIA's driver upgrade state machine
// (github.com/NVIDIA/k8s-operator-libs pkg/upgrade, ClusterUpgradeStateManager) against a cluster,
// reconciling the way the GPU Operator's upgrade controller does, so the gpugate e2e tests see the
// node labels, annotations, cordons, evictions, driver-pod deletions and upgrade-failed verdicts of
// NVIDIA's own code instead of a re-implementation.
//
// What is reproduced from NVIDIA/gpu-operator v26.7.0 (read, not copied):
//   - cmd/gpu-operator/main.go: upgrade.SetDriverName("gpu"); NewClusterUpgradeStateManager with
//     StateOptions{} (in-place mode); WithPodDeletionEnabled(gpuPodSpecFilter) (a Running or Pending
//     pod whose regular containers request or limit an nvidia.com/gpu* or nvidia.com/mig-* resource;
//     the DRA-claim half is left out: the e2e cluster has no NVIDIA ResourceClaims);
//     WithValidationEnabled("app=nvidia-operator-validator");
//     WithRestartOnlyPredicate(predicates.DriverPodRestartOnly) (internal/predicates/restart_only.go:
//     restart in place when DRIVER_CONFIG_DIGEST of the running pod and the DaemonSet template agree,
//     internal/config/driver_config_digest.go reads it from the init containers, then the containers).
//   - controllers/upgrade_controller.go Reconcile: the active ClusterPolicy (the oldest, ties by name:
//     controllers/active_config.go getSingletonClusterPolicy); with none, or with
//     spec.driver.useNvidiaDriverCRD, reconcileNVIDIADriverUpgrades: one BuildState over every pod
//     labelled app.kubernetes.io/component=nvidia-driver in the operator namespace, partitioned by
//     the node label nvidia.com/gpu-operator.driver.owner, then per NVIDIADriver
//     GetUpgradePolicyWithDefaults (api/nvidia/v1alpha1/nvidiadriver_types.go) and ApplyState; the
//     drain podSelector gets ",nvidia.com/gpu-driver-upgrade-drain.skip!=true" appended; autoUpgrade
//     off removes the state label from the CR's nodes (removeNodeUpgradeStateLabelsForNVD), and from
//     every node when no CR has it on. Otherwise reconcileClusterPolicyDriverUpgrades: BuildState over
//     app=nvidia-driver-daemonset and ApplyState with spec.driver.upgradePolicy.
//   - the controller requeues: here a reconcile runs every --interval, one at a time
//     (MaxConcurrentReconciles: 1), instead of on watch events plus a two-minute requeue.
//
// One guard the operator does not have, because of that polling. BuildState leaves out a driver
// pod that is Pending with no spec.nodeName (upgrade_state.go BuildState, "Driver Pod has no
// NodeName, skipping"), and with it its node. That is the moment after the library deleted a
// node's driver pod (pod-restart-required) and the DaemonSet controller made the new one, before
// the scheduler bound it. Built then, the pool's state lacks a node that is mid-upgrade and
// cordoned: GetUpgradesInProgress and GetCurrentUnavailableNodes (common_manager.go) both miss
// it, GetUpgradesAvailable gives its slot away, and ProcessUpgradeRequiredNodes
// (upgrade_inplace.go) starts the next node past maxParallelUpgrades and maxUnavailable. The
// operator reconciles on node-label, DaemonSet-generation and CR events and every two minutes,
// never on pod events (controllers/upgrade_controller.go SetupWithManager), so it seldom builds a
// state in that window; a reconcile every 0.3 s lands in it in most runs. So the pods BuildState
// listed are kept (podListRecorder), and a pool owning the node of such a pod is not applied this
// reconcile: its report carries the counters of the partial state and "held" names the node.
//
// Each reconcile writes one JSON line (per NVIDIADriver: the library's counters, and whether
// ApplyState ran) to stdout or --report, so a test can tell that a reconcile has happened since it
// changed something, and what each one saw.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	upgradev1alpha1 "github.com/NVIDIA/k8s-operator-libs/api/upgrade/v1alpha1"
	"github.com/NVIDIA/k8s-operator-libs/pkg/upgrade"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	ownerLabel          = "nvidia.com/gpu-operator.driver.owner"
	componentLabel      = "app.kubernetes.io/component"
	componentDriver     = "nvidia-driver"
	appLabel            = "app"
	appDriver           = "nvidia-driver-daemonset"
	validatorSelector   = "app=nvidia-operator-validator"
	skipDrainSelector   = "nvidia.com/gpu-driver-upgrade-drain.skip!=true"
	driverConfigDigest  = "DRIVER_CONFIG_DIGEST"
	eventComponent      = "nvidia-gpu-operator"
	defaultMaxUnavailPc = "25%"
)

var (
	clusterPolicies = schema.GroupVersionResource{Group: "nvidia.com", Version: "v1", Resource: "clusterpolicies"}
	nvidiaDrivers   = schema.GroupVersionResource{Group: "nvidia.com", Version: "v1alpha1", Resource: "nvidiadrivers"}
)

type controller struct {
	log       logr.Logger
	manager   upgrade.ClusterUpgradeStateManager
	listed    *podListRecorder
	dynamic   dynamic.Interface
	core      kubernetes.Interface
	namespace string
}

// poolReport is what one reconcile did for one NVIDIADriver (or the ClusterPolicy): the library's
// counters over the state BuildState built, whether ApplyState ran on it, and if not, which nodes
// that state lacked (their driver pod not bound yet).
type poolReport struct {
	Name        string   `json:"name"`
	AutoUpgrade bool     `json:"autoUpgrade"`
	Managed     int      `json:"managed"`
	InProgress  int      `json:"inProgress"`
	Done        int      `json:"done"`
	Failed      int      `json:"failed"`
	Pending     int      `json:"pending"`
	Available   int      `json:"available"`
	Applied     bool     `json:"applied"`
	Held        []string `json:"held,omitempty"`
}

// podListRecorder is the library's own client (CommonUpgradeManagerImpl.K8sClient) keeping the last
// pod list it returned. BuildState is the library's only pod List through that client
// (upgrade_state.go; the drain, pod and validation managers use the clientset), so after BuildState
// it holds exactly the driver pods that state was built from.
type podListRecorder struct {
	client.Client
	mu   sync.Mutex
	pods []corev1.Pod
}

func (r *podListRecorder) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := r.Client.List(ctx, list, opts...)
	if pods, ok := list.(*corev1.PodList); ok && err == nil {
		r.mu.Lock()
		r.pods = append([]corev1.Pod(nil), pods.Items...)
		r.mu.Unlock()
	}
	return err
}

// take returns the pods of the last pod list and forgets them.
func (r *podListRecorder) take() []corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	pods := r.pods
	r.pods = nil
	return pods
}

type reconcileReport struct {
	Serial int          `json:"serial"`
	At     string       `json:"at"`
	Mode   string       `json:"mode"`
	Pools  []poolReport `json:"pools"`
	Error  string       `json:"error,omitempty"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "gpu-operator", "the operator namespace (where the driver DaemonSets are)")
	interval := flag.Duration("interval", 500*time.Millisecond, "time between reconciles")
	verbosity := flag.Int("v", 1, "log verbosity of the library (k8s-operator-libs pkg/consts levels)")
	reportPath := flag.String("report", "", "append one JSON line per reconcile to this file (default: stdout)")
	flag.Parse()

	log := funcr.New(func(prefix, args string) {
		fmt.Fprintf(os.Stderr, "%s %s %s\n", time.Now().UTC().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: *verbosity}).WithName("controllers").WithName("Upgrade")

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(log, err, "reading the kubeconfig")
	}
	config.QPS, config.Burst = 50, 100
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := newController(ctx, log, config, *namespace)
	if err != nil {
		fail(log, err, "building the upgrade state manager")
	}
	out := os.Stdout
	if *reportPath != "" {
		out, err = os.OpenFile(*reportPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			fail(log, err, "opening the report file")
		}
	}
	for serial := 1; ; serial++ {
		report := c.reconcile(ctx)
		report.Serial = serial
		report.At = time.Now().UTC().Format(time.RFC3339Nano)
		line, _ := json.Marshal(report)
		fmt.Fprintln(out, string(line))
		select {
		case <-ctx.Done():
			return
		case <-time.After(*interval):
		}
	}
}

func fail(log logr.Logger, err error, what string) {
	log.Error(err, what)
	os.Exit(1)
}

func newController(ctx context.Context, log logr.Logger, config *rest.Config, namespace string) (*controller, error) {
	core, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: core.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventComponent})

	upgrade.SetDriverName("gpu")
	manager, err := upgrade.NewClusterUpgradeStateManager(log, config, recorder, upgrade.StateOptions{})
	if err != nil {
		return nil, err
	}
	manager = manager.
		WithPodDeletionEnabled(gpuPodSpecFilter).
		WithValidationEnabled(validatorSelector).
		WithRestartOnlyPredicate(restartOnly(log))
	impl, ok := manager.(*upgrade.ClusterUpgradeStateManagerImpl)
	if !ok {
		return nil, fmt.Errorf("the library's state manager is a %T, not a *ClusterUpgradeStateManagerImpl", manager)
	}
	listed := &podListRecorder{Client: impl.K8sClient}
	impl.K8sClient = listed
	return &controller{log: log, manager: manager, listed: listed, dynamic: dyn, core: core, namespace: namespace}, nil
}

// buildState is the library's BuildState, plus the driver pods it left out for having no node yet
// (its own test: Pending and spec.nodeName empty), as node -> pod. The node is the one the DaemonSet
// controller pins the pod to (kubernetes pkg/controller/daemon/util
// ReplaceDaemonSetPodNodeNameNodeAffinity: a matchFields term metadata.name In [node]); "" when a
// pod names none.
func (c *controller) buildState(ctx context.Context, labels map[string]string) (
	*upgrade.ClusterUpgradeState, map[string]string, error) {
	c.listed.take()
	state, err := c.manager.BuildState(ctx, c.namespace, labels)
	if err != nil {
		return nil, nil, fmt.Errorf("BuildState: %w", err)
	}
	unbound := map[string]string{}
	for _, pod := range c.listed.take() {
		if pod.Spec.NodeName == "" && pod.Status.Phase == corev1.PodPending {
			unbound[pinnedNode(&pod)] = pod.Name
		}
	}
	return state, unbound, nil
}

// pinnedNode: the node a DaemonSet pod's required node affinity names by metadata.name, or "".
func pinnedNode(pod *corev1.Pod) string {
	if pod.Spec.Affinity == nil || pod.Spec.Affinity.NodeAffinity == nil {
		return ""
	}
	required := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if required == nil {
		return ""
	}
	for _, term := range required.NodeSelectorTerms {
		for _, field := range term.MatchFields {
			if field.Key == "metadata.name" && field.Operator == corev1.NodeSelectorOpIn && len(field.Values) == 1 {
				return field.Values[0]
			}
		}
	}
	return ""
}

// heldPools: per NVIDIADriver, the nodes of unbound it owns, as "node (driver pod P not bound
// yet)"; a pod whose node is unknown holds every pool ("*"), a node that is gone holds none.
func (c *controller) heldPools(ctx context.Context, unbound map[string]string) (map[string][]string, error) {
	held := map[string][]string{}
	for node, pod := range unbound {
		reason := fmt.Sprintf("%s (driver pod %s not bound yet)", node, pod)
		if node == "" {
			held["*"] = append(held["*"], reason)
			continue
		}
		found, err := c.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading node %s of unbound driver pod %s: %w", node, pod, err)
		}
		owner := found.Labels[ownerLabel]
		held[owner] = append(held[owner], reason)
	}
	for owner := range held {
		sort.Strings(held[owner])
	}
	return held, nil
}

// gpuPodSpecFilter: the pods pod deletion removes (gpu-operator cmd/gpu-operator/main.go gpuPodSpecFilter,
// without the DRA-claim lookup).
func gpuPodSpecFilter(pod corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning && pod.Status.Phase != corev1.PodPending {
		return false
	}
	asksForGPU := func(resources corev1.ResourceList) bool {
		for name := range resources {
			if strings.HasPrefix(string(name), "nvidia.com/gpu") || strings.HasPrefix(string(name), "nvidia.com/mig-") {
				return true
			}
		}
		return false
	}
	for _, container := range pod.Spec.Containers {
		if asksForGPU(container.Resources.Limits) || asksForGPU(container.Resources.Requests) {
			return true
		}
	}
	return false
}

// restartOnly: in place when both pod specs carry the same DRIVER_CONFIG_DIGEST (the operator's
// predicates.DriverPodRestartOnly); a missing digest takes the full flow.
func restartOnly(log logr.Logger) upgrade.RestartOnlyPredicate {
	return func(running, desired *corev1.PodSpec) (bool, error) {
		have, want := digestOf(running), digestOf(desired)
		same := have != "" && want != "" && have == want
		log.V(1).Info("restart-only predicate", "running", have, "desired", want, "restartOnly", same)
		return same, nil
	}
}

func digestOf(spec *corev1.PodSpec) string {
	if spec == nil {
		return ""
	}
	for _, group := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, container := range group {
			for _, env := range container.Env {
				if env.Name == driverConfigDigest && env.Value != "" {
					return env.Value
				}
			}
		}
	}
	return ""
}

func (c *controller) reconcile(ctx context.Context) reconcileReport {
	report := reconcileReport{}
	policy, err := c.activeClusterPolicy(ctx)
	if err != nil {
		report.Error = err.Error()
		return report
	}
	if policy == nil || useNvidiaDriverCRD(policy) {
		report.Mode = "nvidiadriver"
		report.Pools, err = c.reconcileNVIDIADrivers(ctx)
	} else {
		report.Mode = "clusterpolicy"
		var pool *poolReport
		pool, err = c.reconcileClusterPolicy(ctx, policy)
		if pool != nil {
			report.Pools = []poolReport{*pool}
		}
	}
	if err != nil {
		report.Error = err.Error()
	}
	return report
}

func (c *controller) list(ctx context.Context, resource schema.GroupVersionResource) ([]unstructured.Unstructured, error) {
	listing, err := c.dynamic.Resource(resource).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) { // the CRD is not installed (yet)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", resource.Resource, err)
	}
	return listing.Items, nil
}

func (c *controller) activeClusterPolicy(ctx context.Context) (*unstructured.Unstructured, error) {
	items, err := c.list(ctx, clusterPolicies)
	if err != nil || len(items) == 0 {
		return nil, err
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i].GetCreationTimestamp(), items[j].GetCreationTimestamp()
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return items[i].GetName() < items[j].GetName()
	})
	return &items[0], nil
}

func useNvidiaDriverCRD(policy *unstructured.Unstructured) bool {
	value, _, _ := unstructured.NestedBool(policy.Object, "spec", "driver", "useNvidiaDriverCRD")
	return value
}

// upgradePolicy decodes spec.<path...>.upgradePolicy into the library's type.
func upgradePolicy(obj *unstructured.Unstructured, path ...string) (*upgradev1alpha1.DriverUpgradePolicySpec, error) {
	raw, found, err := unstructured.NestedFieldNoCopy(obj.Object, append(path, "upgradePolicy")...)
	if err != nil || !found || raw == nil {
		return nil, err
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	policy := &upgradev1alpha1.DriverUpgradePolicySpec{}
	if err := json.Unmarshal(data, policy); err != nil {
		return nil, fmt.Errorf("%s %s: upgradePolicy: %w", obj.GetKind(), obj.GetName(), err)
	}
	return policy, nil
}

// withNVIDIADriverDefaults mirrors NVIDIADriverSpec.GetUpgradePolicyWithDefaults: an absent policy is
// on with one upgrade at a time; absent sections take their defaults.
func withNVIDIADriverDefaults(policy *upgradev1alpha1.DriverUpgradePolicySpec) *upgradev1alpha1.DriverUpgradePolicySpec {
	if policy == nil {
		policy = &upgradev1alpha1.DriverUpgradePolicySpec{AutoUpgrade: true, MaxParallelUpgrades: 1}
	}
	if policy.MaxUnavailable == nil {
		value := intstr.FromString(defaultMaxUnavailPc)
		policy.MaxUnavailable = &value
	}
	if policy.PodDeletion == nil {
		policy.PodDeletion = &upgradev1alpha1.PodDeletionSpec{TimeoutSecond: 300}
	}
	if policy.WaitForCompletion == nil {
		policy.WaitForCompletion = &upgradev1alpha1.WaitForCompletionSpec{}
	}
	if policy.DrainSpec == nil {
		policy.DrainSpec = &upgradev1alpha1.DrainSpec{TimeoutSecond: 300}
	}
	return policy
}

// withSkipDrainSelector: the operator never drains pods labelled gpu-driver-upgrade-drain.skip=true.
func withSkipDrainSelector(policy *upgradev1alpha1.DriverUpgradePolicySpec) {
	if policy.DrainSpec == nil {
		policy.DrainSpec = &upgradev1alpha1.DrainSpec{}
	}
	if policy.DrainSpec.PodSelector == "" {
		policy.DrainSpec.PodSelector = skipDrainSelector
	} else {
		policy.DrainSpec.PodSelector += "," + skipDrainSelector
	}
}

func (c *controller) counters(name string, state *upgrade.ClusterUpgradeState,
	policy *upgradev1alpha1.DriverUpgradePolicySpec) (poolReport, error) {
	total := c.manager.GetTotalManagedNodes(state)
	maxUnavailable := total
	if policy.MaxUnavailable != nil {
		scaled, err := intstr.GetScaledValueFromIntOrPercent(policy.MaxUnavailable, total, true)
		if err != nil {
			return poolReport{}, fmt.Errorf("%s: maxUnavailable: %w", name, err)
		}
		maxUnavailable = scaled
	}
	return poolReport{
		Name: name, AutoUpgrade: policy.AutoUpgrade, Managed: total,
		InProgress: c.manager.GetUpgradesInProgress(state), Done: c.manager.GetUpgradesDone(state),
		Failed: c.manager.GetUpgradesFailed(state), Pending: c.manager.GetUpgradesPending(state),
		Available: c.manager.GetUpgradesAvailable(state, policy.MaxParallelUpgrades, maxUnavailable),
	}, nil
}

func (c *controller) reconcileNVIDIADrivers(ctx context.Context) ([]poolReport, error) {
	drivers, err := c.list(ctx, nvidiaDrivers)
	if err != nil {
		return nil, err
	}
	policies := map[string]*upgradev1alpha1.DriverUpgradePolicySpec{}
	anyOn := false
	for i := range drivers {
		policy, err := upgradePolicy(&drivers[i], "spec")
		if err != nil {
			return nil, err
		}
		policy = withNVIDIADriverDefaults(policy)
		policies[drivers[i].GetName()] = policy
		anyOn = anyOn || policy.AutoUpgrade
	}
	if !anyOn {
		return nil, c.removeStateLabels(ctx, "")
	}
	cluster, unbound, err := c.buildState(ctx, map[string]string{componentLabel: componentDriver})
	if err != nil {
		return nil, err
	}
	held, err := c.heldPools(ctx, unbound)
	if err != nil {
		return nil, err
	}
	byOwner := map[string]*upgrade.ClusterUpgradeState{}
	for key, nodes := range cluster.NodeStates {
		for _, node := range nodes {
			owner := node.Node.Labels[ownerLabel]
			if owner == "" {
				continue
			}
			if byOwner[owner] == nil {
				state := upgrade.NewClusterUpgradeState()
				byOwner[owner] = &state
			}
			byOwner[owner].NodeStates[key] = append(byOwner[owner].NodeStates[key], node)
		}
	}
	var reports []poolReport
	for i := range drivers {
		name := drivers[i].GetName()
		policy := policies[name]
		if !policy.AutoUpgrade {
			if err := c.removeStateLabels(ctx, name); err != nil {
				return reports, err
			}
			reports = append(reports, poolReport{Name: name})
			continue
		}
		state, ok := byOwner[name]
		if !ok {
			state = &upgrade.ClusterUpgradeState{NodeStates: map[string][]*upgrade.NodeUpgradeState{}}
		}
		report, err := c.counters(name, state, policy)
		if err != nil {
			return reports, err
		}
		if report.Held = append(held[name], held["*"]...); len(report.Held) > 0 {
			c.log.Info("state lacks a node whose driver pod is not bound yet; ApplyState waits",
				"nvidiadriver", name, "held", report.Held)
			reports = append(reports, report)
			continue
		}
		if !ok {
			continue
		}
		withSkipDrainSelector(policy)
		if err := c.manager.ApplyState(ctx, state, policy); err != nil {
			return reports, fmt.Errorf("ApplyState for NVIDIADriver %s: %w", name, err)
		}
		report.Applied = true
		reports = append(reports, report)
	}
	return reports, nil
}

func (c *controller) reconcileClusterPolicy(ctx context.Context, obj *unstructured.Unstructured) (*poolReport, error) {
	policy, err := upgradePolicy(obj, "spec", "driver")
	if err != nil {
		return nil, err
	}
	if policy == nil || !policy.AutoUpgrade {
		return &poolReport{Name: obj.GetName()}, c.removeStateLabels(ctx, "")
	}
	state, unbound, err := c.buildState(ctx, map[string]string{appLabel: appDriver})
	if err != nil {
		return nil, err
	}
	report, err := c.counters(obj.GetName(), state, policy)
	if err != nil {
		return nil, err
	}
	for node, pod := range unbound { // one pool: every unbound driver pod holds it
		report.Held = append(report.Held, fmt.Sprintf("%s (driver pod %s not bound yet)", node, pod))
	}
	if len(report.Held) > 0 {
		sort.Strings(report.Held)
		c.log.Info("state lacks a node whose driver pod is not bound yet; ApplyState waits",
			"clusterpolicy", obj.GetName(), "held", report.Held)
		return &report, nil
	}
	withSkipDrainSelector(policy)
	if err := c.manager.ApplyState(ctx, state, policy); err != nil {
		return &report, fmt.Errorf("ApplyState for ClusterPolicy %s: %w", obj.GetName(), err)
	}
	report.Applied = true
	return &report, nil
}

// removeStateLabels drops the upgrade-state label from the nodes of one NVIDIADriver ("" = every node).
func (c *controller) removeStateLabels(ctx context.Context, owner string) error {
	options := metav1.ListOptions{}
	if owner != "" {
		options.LabelSelector = ownerLabel + "=" + owner
	}
	nodes, err := c.core.CoreV1().Nodes().List(ctx, options)
	if err != nil {
		return err
	}
	key := upgrade.GetUpgradeStateLabelKey()
	for _, node := range nodes.Items {
		if _, present := node.Labels[key]; !present {
			continue
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, key)
		if _, err := c.core.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch,
			metav1.PatchOptions{}); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return nil
}
