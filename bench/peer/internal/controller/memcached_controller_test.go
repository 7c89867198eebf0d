package controller

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	memcachedv1 "memcached-operator/bench/peer/api/v1"
)

// TestReconcileAgainstFakeClient walks the seed's reconcile steps against
// controller-runtime's fake client: Deployment created (requeue), Service
// created, replicas follow spec.size, pod names land in status.nodes.
func TestReconcileAgainstFakeClient(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := memcachedv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	m := &memcachedv1.Memcached{
		ObjectMeta: metav1.ObjectMeta{Name: "memcached-sample", Namespace: "default", UID: "uid-1"},
		Spec:       memcachedv1.MemcachedSpec{Size: 3},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(m).WithStatusSubresource(m).Build()
	r := &MemcachedReconciler{Client: c, Scheme: scheme}
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "memcached-sample"}}

	res, err := r.Reconcile(ctx, req)
	if err != nil || !res.Requeue { //nolint:staticcheck // the seed returns Requeue: true
		t.Fatalf("first reconcile: res=%+v err=%v", res, err)
	}
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, req.NamespacedName, dep); err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 || dep.Spec.Template.Labels["memcached_cr"] != "memcached-sample" ||
		dep.Spec.Template.Spec.Containers[0].Image != "memcached:1.4.36-alpine" {
		t.Fatalf("unexpected deployment: %+v", dep.Spec)
	}
	if ref := metav1.GetControllerOf(dep); ref == nil || ref.Kind != "Memcached" || ref.Name != "memcached-sample" {
		t.Fatalf("unexpected controller ref: %+v", ref)
	}

	for _, name := range []string{"memcached-sample-a", "memcached-sample-b"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labelsForMemcached("memcached-sample")}}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Get(ctx, req.NamespacedName, m); err != nil {
		t.Fatal(err)
	}
	m.Spec.Size = 5
	if err := c.Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, req.NamespacedName, dep); err != nil || *dep.Spec.Replicas != 5 {
		t.Fatalf("replicas not updated: %v %v", err, dep.Spec.Replicas)
	}
	svc := &corev1.Service{}
	if err := c.Get(ctx, req.NamespacedName, svc); err != nil || svc.Spec.Ports[0].Port != 11211 {
		t.Fatalf("service: %v %+v", err, svc.Spec)
	}
	if err := c.Get(ctx, req.NamespacedName, m); err != nil || len(m.Status.Nodes) != 2 {
		t.Fatalf("status.nodes: %v %v", err, m.Status.Nodes)
	}

	// Not found: done, no error.
	other := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "gone"}}
	if res, err := r.Reconcile(ctx, other); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("not found: %+v %v", res, err)
	}
}

// TestDecodeIgnoresUnknownFields: our Rust CRD has more spec/status fields than
// the seed's types; decoding them through the scheme's codecs must not fail.
func TestDecodeIgnoresUnknownFields(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := memcachedv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	doc := []byte(`{"apiVersion":"memcached.cache.example.com/v1","kind":"Memcached",
		"metadata":{"name":"a","namespace":"b"},
		"spec":{"size":2,"image":"memcached:1.6","resources":{"limits":{"memory":"64Mi"}}},
		"status":{"nodes":["a-1","a-2"],"readyReplicas":2,"conditions":[{"type":"Available","status":"True"}]}}`)
	obj, _, err := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode(doc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := obj.(*memcachedv1.Memcached)
	if m.Spec.Size != 2 || len(m.Status.Nodes) != 2 {
		t.Fatalf("decoded %+v", m)
	}
}
