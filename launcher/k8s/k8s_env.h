/* k8s_env.h — what `plait k8s render` writes into every pod's environment and
 * `plait launch` reads back in the pod: the launcher's own contract with
 * Kubernetes (common/place/env.h, the contract with the runtime, knows nothing of
 * it). Besides these, Kubernetes itself injects JOB_COMPLETION_INDEX (an
 * Indexed Job's pod index; with a JobSet of one replicated job of one Job it
 * is the pod's index in the whole gang), and the Secret's key reaches the pod
 * as PLAIT_STORE_SECRET. */
#ifndef PLAIT_LAUNCHER_K8S_ENV_H
#define PLAIT_LAUNCHER_K8S_ENV_H

/* Kubernetes' own: the pod's index in an Indexed Job. */
#define K8S_ENV_COMPLETION_INDEX "JOB_COMPLETION_INDEX"
/* Pods in the gang (one per node). */
#define K8S_ENV_PODS "PLAIT_K8S_PODS"
/* Ranks (GPUs, or CPU ranks) each pod runs. */
#define K8S_ENV_RANKS_PER_POD "PLAIT_K8S_RANKS_PER_POD"
/* Every pod's DNS name, with "{index}" standing for its index:
 * "train-workers-0-{index}.train" (JobSet), "train-{index}.train-ranks"
 * (Indexed Job with its headless Service). Pod 0 hosts the store. */
#define K8S_ENV_POD_DNS "PLAIT_K8S_POD_DNS"
/* The port pod 0's store listens on (the headless Service names it). */
#define K8S_ENV_STORE_PORT "PLAIT_K8S_STORE_PORT"
/* Seconds every pod waits at the gang barrier for all the others before it
 * exits PLAIT_EXIT_RESTART naming the pods that never came. */
#define K8S_ENV_GANG_TIMEOUT_S "PLAIT_K8S_GANG_TIMEOUT_S"
/* Optional: how many times JobSet has restarted the gang, from the pod label
 * jobset.sigs.k8s.io/restart-attempt through the downward API
 * (valueFrom.fieldRef.fieldPath: "metadata.labels['jobset.sigs.k8s.io/restart-attempt']").
 * It becomes the ranks' PLAIT_RESTART_COUNT and keeps one attempt's store keys
 * apart from another's. Absent: a PLAIT_RESTART_COUNT the pod spec sets from
 * the same label is read instead; neither (an Indexed Job without JobSet): 0. */
#define K8S_ENV_RESTART_ATTEMPT "PLAIT_K8S_RESTART_ATTEMPT"
/* Where the ConfigMap's resolved plan is mounted in the pod. */
#define K8S_PLAN_PATH "/etc/plait/plan.json"

#endif
