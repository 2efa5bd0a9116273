"""MMLU's four categories and their subjects (Hendrycks et al., 2021, as lm-evaluation-harness groups them), so
that a table can score one category alone: appendix E knocks the key heads out on MMLU-Humanities.

Each category is a benchmark of its own (`mmlu-humanities`, ...): MMLU's test questions of those subjects, each
5-shot from its own subject's dev questions, as `mmlu` scores them.
"""
from __future__ import annotations

CATEGORY_OF = {
    "abstract_algebra": "stem", "anatomy": "stem", "astronomy": "stem", "business_ethics": "other",
    "clinical_knowledge": "other", "college_biology": "stem", "college_chemistry": "stem",
    "college_computer_science": "stem", "college_mathematics": "stem", "college_medicine": "other",
    "college_physics": "stem", "computer_security": "stem", "conceptual_physics": "stem",
    "econometrics": "social_sciences", "electrical_engineering": "stem", "elementary_mathematics": "stem",
    "formal_logic": "humanities", "global_facts": "other", "high_school_biology": "stem",
    "high_school_chemistry": "stem", "high_school_computer_science": "stem",
    "high_school_european_history": "humanities", "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences", "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem", "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem", "high_school_psychology": "social_sciences", "high_school_statistics": "stem",
    "high_school_us_history": "humanities", "high_school_world_history": "humanities", "human_aging": "other",
    "human_sexuality": "social_sciences", "international_law": "humanities", "jurisprudence": "humanities",
    "logical_fallacies": "humanities", "machine_learning": "stem", "management": "other", "marketing": "other",
    "medical_genetics": "other", "miscellaneous": "other", "moral_disputes": "humanities",
    "moral_scenarios": "humanities", "nutrition": "other", "philosophy": "humanities", "prehistory": "humanities",
    "professional_accounting": "other", "professional_law": "humanities", "professional_medicine": "other",
    "professional_psychology": "social_sciences", "public_relations": "social_sciences",
    "security_studies": "social_sciences", "sociology": "social_sciences", "us_foreign_policy": "social_sciences",
    "virology": "other", "world_religions": "humanities",
}
# benchmark name -> category
CATEGORIES = {f"mmlu-{c.replace('_', '-')}": c for c in ("humanities", "stem", "social_sciences", "other")}
DISPLAY = {name: "MMLU-" + c.replace("_", " ").title().replace(" ", "-").replace("Stem", "STEM")
           for name, c in CATEGORIES.items()}


def subjects_of(benchmark: str) -> frozenset[str]:
    """The MMLU subjects the benchmark scores (every subject for `mmlu`)."""
    if benchmark == "mmlu":
        return frozenset(CATEGORY_OF)
    return frozenset(s for s, c in CATEGORY_OF.items() if c == CATEGORIES[benchmark])
