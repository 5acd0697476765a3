"""Default hyper-parameters, defined once: every loss, counter, command and table takes them from here.

The values are the papers' (definitions file): the Triplet margin 0.2 (VSE++), the COCOS threshold
eps 0.01, the NT-Xent temperature 0.1 and the SmoothAP temperature 0.01 (COCOS paper, §3).
"""

DEFAULT_MARGIN = 0.2  # Triplet, Triplet SH, IMC's cross-modal part, GOAL's T_con
DEFAULT_EPS = 0.01  # the COCOS paper's threshold for NT-Xent and SmoothAP
DEFAULT_TAU_NTXENT = 0.1
DEFAULT_TAU_SMOOTHAP = 0.01
