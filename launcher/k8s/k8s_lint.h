/* k8s_lint.h — what the Kubernetes and CRD schemas cannot see in a manifest
 * stream, checked by the project itself (plait k8s render and admin run it on
 * every manifest before printing it; plait k8s lint on any file): DNS-1123
 * names and the lengths the pods' host names reach, label keys and values,
 * extended resources in a ResourceQuota (only requests.<resource>), GPU
 * requests equal to their limits, a gang's minMember equal to its pods, and
 * an Indexed Job's subdomain served by a headless Service. */
#ifndef PLAIT_LAUNCHER_K8S_LINT_H
#define PLAIT_LAUNCHER_K8S_LINT_H

#include <stddef.h>
#include <stdio.h>

#include "common/error.h"

/* NULL when s is a DNS-1123 label of at most max characters (lower-case
 * letters, digits, '-', starting and ending with a letter or digit), else
 * what is wrong with it. */
const char *k8s_dns_label_problem(const char *s, size_t max);

/* Lints every document of a YAML stream; each problem is one line on report,
 * "SOURCE: document N (Kind/name): path: what is wrong". Returns the number of
 * problems, or -1 with err when the text is not YAML. */
int k8s_lint_text(const char *text, size_t len, const char *source, FILE *report,
                  struct plait_error *err);

#endif
