"""Default hyper-parameters, defined once: every loss, counter, command and table takes them from here.

The values are the papers' (definitions file): the Triplet margin 0.2 (VSE++), the COCOS threshold
eps 0.01, the NT-Xent temperature 0.1 and the SmoothAP temperature 0.01 (COCOS paper, §3).
"""

DEFAULT_MARGIN = 0.2  # Triplet, Triplet SH, IMC's cross-modal part, GOAL's T_con
DEFAULT_EPS = 0.01  # the COCOS paper's threshold for NT-Xent and SmoothAP
DEFAULT_TAU_NTXENT = 0.1
DEFAULT_TAU_SMOOTHAP = 0.01

# The VSE++/COCOS training schedule (``cocos train``'s defaults, read by TrainConfig and the command's flags):
# Adam at 2e-4 for 30 epochs, lowered x0.1 after 15; batch 128; joint embedding 1024, word embedding 300.
DEFAULT_EPOCHS = 30
DEFAULT_LR = 2e-4
DEFAULT_LR_UPDATE = 15
DEFAULT_BATCH_SIZE = 128
DEFAULT_EMBED_SIZE = 1024
DEFAULT_WORD_DIM = 300
DEFAULT_CNN = "resnet50"  # raw images: the COCOS paper's CNN (its job files: --cnn_type=resnet50)

DEFAULT_GRAD_CLIP = 2.0  # VSE++'s gradient-norm clipping
DEFAULT_CROP_SIZE = 224  # raw images: VSE++'s training crop and evaluation centre crop
DEFAULT_RESIZE = 256  # raw images: VSE++'s evaluation Resize (the shorter side) before the 224 centre crop
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the normalisation of ImageNet-trained CNNs (torchvision's)
IMAGENET_STD = (0.229, 0.224, 0.225)

# CLIP clamps its learned logit scale at log(100) (a temperature of at least 0.01)
MAX_LOGIT_SCALE = 4.605170185988092
